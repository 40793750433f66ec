"""mpirun's command line (Open MPI's mpirun, MPICH's hydra): table tests with named cases."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from rankpack.backend.kubernetes.starting import mpirunargs
from rankpack.backend.protocol import BackendError

CASE = Path("/runs/r1")


MPIRUN_CASES = [
    pytest.param(
        {"subnet": "10.201.0.0/24", "as_root": True},
        ["--mca", "oob_tcp_if_include", "10.201.0.0/24", "--allow-run-as-root"],
        id="subnet-root",
    ),
    pytest.param({"subnet": None, "as_root": False}, [], id="no-subnet"),
]


@pytest.mark.parametrize(("given", "present"), MPIRUN_CASES)
def test_mpirun_argv(given: dict[str, Any], present: list[str]) -> None:
    args = mpirunargs.MpirunArgs(
        mpirun="/usr/bin/mpirun",
        n_ranks=4,
        hostfile=CASE / ".rankpack/hostfile",
        agent=CASE / ".rankpack/rsh-agent",
        case_dir=CASE,
        command=("simpleFoam", "-parallel"),
        env={"WM_PROJECT_DIR": "/usr/lib/openfoam", "LD_PRELOAD": "/runs/r1/.rankpack/lib/x.so"},
        **given,
    )
    argv = mpirunargs.mpirun_argv(args)
    text = " ".join(argv)
    assert argv[:3] == ["/usr/bin/mpirun", "-np", "4"]
    assert "--mca plm_rsh_agent /runs/r1/.rankpack/rsh-agent" in text
    assert "--mca plm_rsh_no_tree_spawn 1" in text
    # the default transport: shared memory within a group pod, without CMA's single copy
    assert "--mca pml ob1 --mca btl self,vader,tcp" in text
    assert "--mca btl_vader_single_copy_mechanism none" in text
    assert "--hostfile /runs/r1/.rankpack/hostfile" in text
    assert "-x LD_PRELOAD=/runs/r1/.rankpack/lib/x.so -x WM_PROJECT_DIR=/usr/lib/openfoam" in text
    assert argv[-2:] == ["simpleFoam", "-parallel"]
    for i in range(len(present)):
        assert present[i] in argv
    assert ("btl_tcp_if_include" in argv) == (given["subnet"] is not None)


def _args(**kw: Any) -> mpirunargs.MpirunArgs:
    base: dict[str, Any] = {
        "mpirun": "/usr/bin/mpirun",
        "n_ranks": 2,
        "hostfile": CASE / ".rankpack/hostfile",
        "agent": CASE / ".rankpack/rsh-agent",
        "case_dir": CASE,
        "command": ("imbalance", "-n", "10"),
        "env": {"LD_PRELOAD": "/runs/r1/.rankpack/lib/x.so", "A": "1 2"},
    }
    base.update(kw)
    return mpirunargs.MpirunArgs(**base)


def _pairs(argv: list[str], flag: str, width: int) -> list[list[str]]:
    """Every ``flag`` in argv with the ``width`` values after it."""
    return [argv[i + 1 : i + 1 + width] for i, a in enumerate(argv) if a == flag]


@pytest.mark.parametrize(("transport", "btl"), [("tcp", "self,tcp"), ("auto", "self,vader,tcp")])
def test_open_mpi_transport(transport: str, btl: str) -> None:
    argv = mpirunargs.mpirun_argv(_args(transport=transport))
    assert ["btl", btl] in _pairs(argv, "--mca", 2)
    assert ["pml", "ob1"] in _pairs(argv, "--mca", 2)
    # (process_vm_readv between ranks needs ptrace rights a restricted pod's ranks lack)
    no_cma = ["btl_vader_single_copy_mechanism", "none"] in _pairs(argv, "--mca", 2)
    assert no_cma is (transport == "auto")
    assert "-genv" not in argv and "-localhost" not in argv


MPICH_CASES = [
    pytest.param("tcp", "10.201.0.30", id="tcp-only"),
    pytest.param("auto", None, id="auto-no-address"),
]


@pytest.mark.parametrize(("transport", "address"), MPICH_CASES)
def test_mpich_hydra_argv(transport: str, address: str | None) -> None:
    args = _args(mpirun="/usr/bin/mpiexec.hydra", flavour="mpich", transport=transport,
                 local_address=address, subnet="10.201.0.0/24", as_root=True)  # fmt: skip
    argv = mpirunargs.mpirun_argv(args)
    assert argv[:3] == ["/usr/bin/mpiexec.hydra", "-n", "2"]
    # the same rsh agent as Open MPI's: hydra calls it as `AGENT POD hydra_pmi_proxy ...`
    assert _pairs(argv, "-launcher", 1) == [["rsh"]]
    assert _pairs(argv, "-launcher-exec", 1) == [["/runs/r1/.rankpack/rsh-agent"]]
    assert _pairs(argv, "-f", 1) == [["/runs/r1/.rankpack/hostfile"]]
    assert _pairs(argv, "-wdir", 1) == [[str(CASE)]]
    assert "-genvnone" in argv  # nothing of the launcher's own environment reaches a rank
    assert _pairs(argv, "-localhost", 1) == ([[address]] if address else [])
    genv = {name: value for name, value in _pairs(argv, "-genv", 2)}
    tcp_only = {"MPIR_CVAR_NOLOCAL": "1", "UCX_TLS": "self,tcp"}
    no_cma = {"UCX_TLS": "^cma"}  # shared memory, but not UCX's cma (ptrace rights)
    expected = {"LD_PRELOAD": "/runs/r1/.rankpack/lib/x.so", "A": "1 2"}
    assert genv == {**(tcp_only if transport == "tcp" else no_cma), **expected}
    assert argv[-3:] == ["imbalance", "-n", "10"]
    # no Open MPI option leaks into hydra's command line (it would refuse it)
    assert not [a for a in argv if a.startswith("--")]
    assert "--allow-run-as-root" not in argv and "-x" not in argv


@pytest.mark.parametrize("transport", ["tcp", "auto"])
def test_the_spec_env_wins_over_the_tcp_switches(transport: str) -> None:
    args = _args(flavour="mpich", transport=transport, env={"UCX_TLS": "tcp"})
    argv = mpirunargs.mpirun_argv(args)
    assert dict((n, v) for n, v in _pairs(argv, "-genv", 2))["UCX_TLS"] == "tcp"


@pytest.mark.parametrize(
    ("flavour", "transport", "match"),
    [("intelmpi", "tcp", "cannot be launched"), ("mpich", "shm", "transport")],
)
def test_unknown_mpi_or_transport_is_refused(flavour: str, transport: str, match: str) -> None:
    with pytest.raises(BackendError, match=match):
        mpirunargs.mpirun_argv(_args(flavour=flavour, transport=transport))


def test_agent_path_with_spaces_is_refused() -> None:
    args = mpirunargs.MpirunArgs("mpirun", 1, Path("/h"), Path("/a b/agent"), CASE, ("x",), {})
    with pytest.raises(BackendError, match="whitespace"):
        mpirunargs.mpirun_argv(args)


# -- Open MPI 5 (PRRTE) --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "major"),
    [
        ("mpirun (Open MPI) 4.1.4\n\nReport bugs to http://www.open-mpi.org/community/help/\n", 4),
        ("mpirun (Open MPI) 5.0.7\n\nReport bugs to https://www.open-mpi.org/community/help/\n", 5),
        ("mpirun.openmpi (OpenRTE) 4.1.4\n\nReport bugs to http://www.open-mpi.org/\n", 4),
        ("Open MPI v5.0.7\n\nhttps://www.open-mpi.org/community/help/\n", 5),  # ompi_info
        ("HYDRA build details:\n    Version:                                 4.0.2\n", None),
        ("prterun (PRRTE) 3.0.8\n", None),  # PRRTE's own version is not Open MPI's
        ("", None),
    ],
    ids=[
        "openmpi-4.1",
        "openmpi-5.0",
        "openrte-4.1",
        "ompi_info-5",
        "mpich-hydra",
        "prterun",
        "nothing",
    ],
)
def test_openmpi_major(text: str, major: int | None) -> None:
    assert mpirunargs.openmpi_major(text) == major


@pytest.mark.parametrize("major", [3, 4])
def test_orte_majors_get_the_same_argv(major: int) -> None:
    """Open MPI 3 and 4 (ORTE) get what they always got, whatever the version says."""
    assert mpirunargs.mpirun_argv(_args(openmpi_major=major)) == mpirunargs.mpirun_argv(_args())


PRRTE_CASES = [
    pytest.param({"transport": "tcp"}, "self,tcp", False, id="tcp"),
    pytest.param({"transport": "auto"}, "self,sm,tcp", True, id="auto"),
]


@pytest.mark.parametrize(("given", "btl", "no_cma"), PRRTE_CASES)
@pytest.mark.parametrize("major", [5, 6])
def test_open_mpi_5_gets_prrtes_options(
    given: dict[str, Any], btl: str, no_cma: bool, major: int
) -> None:
    args = _args(openmpi_major=major, subnet="10.201.0.0/24", as_root=True, **given)
    argv = mpirunargs.mpirun_argv(args)
    assert argv[:3] == ["/usr/bin/mpirun", "-np", "2"]
    assert _pairs(argv, "--hostfile", 1) == [["/runs/r1/.rankpack/hostfile"]]
    assert _pairs(argv, "--map-by", 1) == [["slot"]] and _pairs(argv, "--bind-to", 1) == [["none"]]
    assert _pairs(argv, "--wdir", 1) == [[str(CASE)]]
    # the rsh agent and no tree spawn: PRRTE's parameters, in its names
    assert _pairs(argv, "--prtemca", 2) == [
        ["plm_ssh_agent", "/runs/r1/.rankpack/rsh-agent"],
        ["plm_ssh_no_tree_spawn", "1"],
    ]
    mca = _pairs(argv, "--mca", 2)
    assert ["pml", "ob1"] in mca and ["btl", btl] in mca
    assert (["smsc", "^cma"] in mca) is no_cma  # (Open MPI 5's single copy: CMA, ptrace)
    assert ["btl_tcp_if_include", "10.201.0.0/24"] in mca
    # no ORTE names, no OOB subnet (PRRTE 3.0 cannot match one: it warns and ignores it)
    assert not [a for a in argv if "vader" in a or "plm_rsh" in a or "oob_" in a]
    assert "--allow-run-as-root" in argv
    assert _pairs(argv, "-x", 1) == [["A=1 2"], ["LD_PRELOAD=/runs/r1/.rankpack/lib/x.so"]]
    assert argv[-3:] == ["imbalance", "-n", "10"]


def test_mpich_ignores_the_open_mpi_version() -> None:
    mpich = {"mpirun": "/usr/bin/mpiexec.hydra", "flavour": "mpich"}
    assert mpirunargs.mpirun_argv(_args(openmpi_major=5, **mpich)) == mpirunargs.mpirun_argv(
        _args(**mpich)
    )
