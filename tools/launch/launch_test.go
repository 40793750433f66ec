package launch

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

func TestStatus(t *testing.T) {
	for rc, want := range map[int]int{0: 0, 3: 3, 300: 255, -15: 143, -9: 137} {
		if got := Status(rc); got != want {
			t.Errorf("Status(%d) = %d, want %d", rc, got, want)
		}
	}
}

func TestBadSpecsAreRefused(t *testing.T) {
	for name, text := range map[string]string{
		"not json":        "{",
		"version":         `{"version": 2, "mpirun": ["mpirun"], "cwd": "/c", "log": "/l", "exit": "/d/mpirun.exit"}`,
		"no mpirun":       `{"version": 1, "mpirun": [], "cwd": "/c", "log": "/l", "exit": "/d/mpirun.exit"}`,
		"relative":        `{"version": 1, "mpirun": ["mpirun"], "cwd": "c", "log": "/l", "exit": "/d/mpirun.exit"}`,
		"other exit name": `{"version": 1, "mpirun": ["mpirun"], "cwd": "/c", "log": "/l", "exit": "/d/x"}`,
	} {
		if _, err := ParseSpec([]byte(text)); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

func TestAnExitFileIsWrittenAtomicallyOverALinkNeverThroughIt(t *testing.T) {
	d := t.TempDir()
	target := filepath.Join(d, "elsewhere")
	os.WriteFile(target, []byte("keep"), 0o644)
	exit := filepath.Join(d, Exit)
	os.Symlink(target, exit)
	if _, ok := ReadExit(exit); ok {
		t.Fatal("read through a link")
	}
	if err := WriteExit(exit, -15); err != nil {
		t.Fatal(err)
	}
	if data, _ := os.ReadFile(target); string(data) != "keep" {
		t.Fatalf("wrote through the link: %q", data)
	}
	if code, ok := ReadExit(exit); !ok || code != -15 {
		t.Fatalf("%d %v", code, ok)
	}
}

func TestTheMarkerSaysNeverRunningOrDied(t *testing.T) {
	d := t.TempDir()
	if s, _ := State(d); s != "never" {
		t.Fatalf("no marker: %s", s)
	}
	f, err := Begin(d)
	if err != nil || f == nil {
		t.Fatal(err)
	}
	if s, _ := State(d); s != "running" {
		t.Fatalf("held: %s", s)
	}
	if g, _ := Begin(d); g != nil {
		t.Fatal("a second Begin took a held marker")
	}
	f.Close() // the starter died before the spawn
	if s, _ := State(d); s != "never" {
		t.Fatalf("left starting: %s", s)
	}
	f, _ = Begin(d)
	Launched(f, 4242)
	f.Close() // the launcher and mpirun died
	if s, _ := State(d); s != "died" {
		t.Fatalf("left with a pid: %s", s)
	}
	WriteExit(filepath.Join(d, Exit), 0)
	if s, _ := State(d); s != "ended" {
		t.Fatalf("with an exit file: %s", s)
	}
}

// fakeMpirun writes a script named mpirun into a directory of its own: it records
// its argv, its environment's LD_PRELOAD and whether the marker is held, then runs body.
func fakeMpirun(t *testing.T, body string) (string, string) {
	t.Helper()
	bin := t.TempDir()
	rec := filepath.Join(t.TempDir(), "calls")
	script := "#!/bin/sh\necho \"$* preload=${LD_PRELOAD:-none} x=$RANKPACK_X\" >> " + rec + "\n" + body + "\n"
	os.WriteFile(filepath.Join(bin, "mpirun"), []byte(script), 0o755)
	return bin, rec
}

func newRun(t *testing.T, bin string) (*Run, string) {
	d := t.TempDir()
	spec := &Spec{Version: 1, Mpirun: []string{"mpirun.openmpi", "mpirun"}, Args: []string{"-np", "2", "solver"},
		Cwd: d, Env: map[string]string{"RANKPACK_X": "1"}, Log: filepath.Join(d, "log.solver"),
		Exit: filepath.Join(d, Exit)}
	env := []string{"PATH=" + bin, "LD_PRELOAD=/evil.so"} // (not this machine's mpirun.openmpi)
	return &Run{Spec: spec, Environ: env, Sleep: func(time.Duration) {}}, d
}

func TestARunStartsMpirunOnceAndRecordsItsExit(t *testing.T) {
	bin, rec := fakeMpirun(t, "echo solving; exit 3")
	r, d := newRun(t, bin)
	status, err := r.Execute()
	if err != nil || status != 3 {
		t.Fatalf("status %d, %v", status, err)
	}
	calls, _ := os.ReadFile(rec)
	if string(calls) != "-np 2 solver preload=none x=1\n" {
		t.Fatalf("calls %q", calls)
	}
	if log, _ := os.ReadFile(filepath.Join(d, "log.solver")); string(log) != "solving\n" {
		t.Fatalf("log %q", log)
	}
	if code, ok := ReadExit(filepath.Join(d, Exit)); !ok || code != 3 {
		t.Fatalf("exit file %d %v", code, ok)
	}
	again, _ := newRun(t, bin)
	again.Spec = r.Spec
	if status, err := again.Execute(); err != nil || status != 3 {
		t.Fatalf("again: %d %v", status, err)
	}
	if calls2, _ := os.ReadFile(rec); string(calls2) != string(calls) {
		t.Fatalf("mpirun ran twice: %q", calls2)
	}
}

func TestMpirunHoldsTheMarkerWhileItRuns(t *testing.T) {
	bin, _ := fakeMpirun(t, "/bin/sleep 0.5")
	r, d := newRun(t, bin)
	done := make(chan int)
	go func() { s, _ := r.Execute(); done <- s }()
	time.Sleep(250 * time.Millisecond)
	if s, _ := State(d); s != "running" {
		t.Fatalf("while mpirun runs: %s", s)
	}
	data, _ := os.ReadFile(filepath.Join(d, Marker))
	if pid, err := strconv.Atoi(strings.TrimSpace(string(data))); err != nil || pid <= 0 {
		t.Fatalf("marker %q", data)
	}
	if s := <-done; s != 0 {
		t.Fatalf("status %d", s)
	}
}

func TestAHeldMarkerIsNeverLaunchedTwice(t *testing.T) {
	bin, rec := fakeMpirun(t, "true")
	r, d := newRun(t, bin)
	held, _ := Begin(d)
	defer held.Close()
	_, err := r.Execute()
	if f, ok := err.(*Failure); !ok || f.Code != ErrorExit || !strings.Contains(f.Message, "launched already") {
		t.Fatalf("%v", err)
	}
	if _, err := os.Stat(rec); err == nil {
		t.Fatal("mpirun ran")
	}
}

func TestASignalBeforeMpirunStartsItNever(t *testing.T) {
	bin, rec := fakeMpirun(t, "true")
	r, _ := newRun(t, bin)
	r.OnSignal(syscall.SIGTERM)
	_, err := r.Execute()
	if f, ok := err.(*Failure); !ok || f.Code != 128+15 {
		t.Fatalf("%v", err)
	}
	if _, err := os.Stat(rec); err == nil {
		t.Fatal("mpirun ran")
	}
}

func TestSigtermIsPassedOnAndADeathBySignalRecorded(t *testing.T) {
	bin, _ := fakeMpirun(t, "exec /bin/sleep 30")
	r, d := newRun(t, bin)
	go func() {
		time.Sleep(300 * time.Millisecond)
		r.OnSignal(syscall.SIGTERM)
	}()
	status, err := r.Execute()
	if err != nil || status != 143 {
		log, _ := os.ReadFile(filepath.Join(d, "log.solver"))
		t.Fatalf("status %d %v: %s", status, err, log)
	}
	if code, ok := ReadExit(filepath.Join(d, Exit)); !ok || code != -15 {
		t.Fatalf("exit file %d %v", code, ok)
	}
}

func TestNoMpirunInTheImageSaysWhatItLookedFor(t *testing.T) {
	r, _ := newRun(t, t.TempDir())
	r.Environ = []string{"PATH=" + t.TempDir()}
	_, err := r.Execute()
	if err == nil || !strings.Contains(err.Error(), "no mpirun.openmpi or mpirun in this image") {
		t.Fatalf("%v", err)
	}
}

func TestALinkInPlaceOfTheLogIsNotFollowed(t *testing.T) {
	bin, rec := fakeMpirun(t, "true")
	r, d := newRun(t, bin)
	secret := filepath.Join(t.TempDir(), "secret")
	os.WriteFile(secret, []byte("s"), 0o600)
	os.Symlink(secret, filepath.Join(d, "log.solver"))
	_, err := r.Execute()
	if err == nil || !strings.Contains(err.Error(), "symbolic link") {
		t.Fatalf("%v", err)
	}
	if _, err := os.Stat(rec); err == nil {
		t.Fatal("mpirun ran")
	}
}

func TestOpenMPIMajorReadsTheVersionLine(t *testing.T) {
	for text, want := range map[string]int{
		"mpirun (Open MPI) 4.1.4\n\nReport bugs to http://www.open-mpi.org/community/help/\n":  4,
		"mpirun (Open MPI) 5.0.7\n\nReport bugs to https://www.open-mpi.org/community/help/\n": 5,
		"Open MPI v5.0.7\n\nhttps://www.open-mpi.org/community/help/\n":                        5,
		"prterun (Open MPI) 6.0.0rc1\n":                                                        6,
		"mpirun.openmpi (OpenRTE) 4.1.4\n\nReport bugs to http://www.open-mpi.org/\n":          4,
	} {
		if got, ok := OpenMPIMajor(text); !ok || got != want {
			t.Errorf("%q: %d %v, want %d", text, got, ok, want)
		}
	}
	for _, text := range []string{"", "HYDRA build details:\n    Version: 4.0.2\n", "mpirun (Open MPI) x"} {
		if got, ok := OpenMPIMajor(text); ok {
			t.Errorf("%q: %d", text, got)
		}
	}
}

func TestChooseArgsTakesTheLargestMajorNotAboveTheVersion(t *testing.T) {
	s := &Spec{Args: []string{"orte"}, ArgsFromMajor: map[string][]string{"5": {"prrte"}, "7": {"seven"}}}
	for version, want := range map[string]string{
		"mpirun (Open MPI) 4.1.4": "orte",
		"mpirun (Open MPI) 5.0.7": "prrte",
		"mpirun (Open MPI) 6.1.0": "prrte",
		"mpirun (Open MPI) 7.0.0": "seven",
		"":                        "orte", // it did not say: the default
		"HYDRA build details":     "orte",
	} {
		if got := ChooseArgs(s, version); len(got) != 1 || got[0] != want {
			t.Errorf("%q: %v, want %s", version, got, want)
		}
	}
}

func TestBadMajorKeysAreRefused(t *testing.T) {
	base := `{"version": 1, "mpirun": ["mpirun"], "cwd": "/c", "log": "/l", "exit": "/d/mpirun.exit", `
	for _, key := range []string{"x", "0", "05", "-1", ""} {
		if _, err := ParseSpec([]byte(base + `"args_from_major": {"` + key + `": []}}`)); err == nil {
			t.Errorf("key %q accepted", key)
		}
	}
	s, err := ParseSpec([]byte(base + `"args_from_major": {"5": ["-n", "2"]}}`))
	if err != nil || len(s.ArgsFromMajor["5"]) != 2 {
		t.Fatalf("%v %v", s, err)
	}
}

func TestAnOpenMPI5GetsItsArgumentsFromItsOwnVersion(t *testing.T) {
	bin, rec := fakeMpirun(t, `[ "$1" = --version ] && echo "mpirun (Open MPI) 5.0.7"; true`)
	r, _ := newRun(t, bin)
	r.Spec.ArgsFromMajor = map[string][]string{"5": {"--prtemca", "x", "solver"}}
	if status, err := r.Execute(); err != nil || status != 0 {
		t.Fatalf("status %d, %v", status, err)
	}
	calls, _ := os.ReadFile(rec)
	if string(calls) != "--version preload=none x=1\n--prtemca x solver preload=none x=1\n" {
		t.Fatalf("calls %q", calls)
	}
	// An Open MPI 4 (or an mpirun that says nothing) gets Args.
	bin4, rec4 := fakeMpirun(t, `[ "$1" = --version ] && echo "mpirun (Open MPI) 4.1.4"; true`)
	r4, _ := newRun(t, bin4)
	r4.Spec.ArgsFromMajor = r.Spec.ArgsFromMajor
	r4.Execute()
	if calls, _ := os.ReadFile(rec4); !strings.HasSuffix(string(calls), "\n-np 2 solver preload=none x=1\n") {
		t.Fatalf("calls %q", calls)
	}
}

func TestTheVersionIsReadBounded(t *testing.T) {
	bin := t.TempDir()
	os.WriteFile(filepath.Join(bin, "chatty"), []byte("#!/bin/sh\nyes 'mpirun (Open MPI) 5.0.7'\n"), 0o755)
	start := time.Now()
	out := MpirunVersion(filepath.Join(bin, "chatty"), nil)
	if len(out) != VersionMax || time.Since(start) > VersionTimeout+2*time.Second {
		t.Fatalf("%d bytes in %v", len(out), time.Since(start))
	}
	if MpirunVersion(filepath.Join(bin, "absent"), nil) != "" {
		t.Fatal("output from nothing")
	}
}

func TestTheSpecIsAwaitedUntilItIsWritten(t *testing.T) {
	dir := t.TempDir()
	spec := filepath.Join(dir, "launch.json")
	looks := 0
	sleep := func(time.Duration) {
		looks++
		if looks == 3 {
			os.WriteFile(spec, []byte("{}"), 0o644)
		}
	}
	if f := AwaitSpec(spec, time.Minute, sleep); f != nil || looks != 3 {
		t.Fatalf("%v after %d looks", f, looks)
	}
}

func TestAFailedPreparationEndsTheWaitWithItsReason(t *testing.T) {
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, Failed), []byte("rank pods not running after 300 s: g1: Pending\n"), 0o644)
	f := AwaitSpec(filepath.Join(dir, "launch.json"), time.Minute, func(time.Duration) { t.Fatal("slept") })
	if f == nil || f.Message != "the launcher's preparation failed: rank pods not running after 300 s: g1: Pending" || f.Code != ErrorExit {
		t.Fatalf("%+v", f)
	}
}

func TestTheWaitForASpecIsBounded(t *testing.T) {
	looks := 0
	f := AwaitSpec(filepath.Join(t.TempDir(), "launch.json"), 50*time.Millisecond, func(time.Duration) { looks++ })
	if f == nil || !strings.Contains(f.Message, "no launch spec at") || looks != 5 {
		t.Fatalf("%v after %d looks", f, looks)
	}
}
