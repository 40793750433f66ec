// Package launch is the launcher pod's last step, in the Simulation's own image:
// rankpack-launch LAUNCH.json starts mpirun once and records how it ended.
//
// The launcher pod's prepare container (rankpack's image, the launcher's
// ServiceAccount; rankpack.backend.kubernetes.starting.launcher) runs beside this
// one: it waits for the rank pods and writes LAUNCH.json (a Spec) into a volume
// only this pod mounts, or, when it cannot, Failed beside it. Here, in the
// container that holds no token:
//
//  0. wait until LAUNCH.json or Failed is there (AwaitSpec: a look every 10 ms;
//     both are written whole, by rename);
//  1. an exit file from an earlier run ends it at once with that run's status;
//  2. the launch marker in the exit file's directory is taken (flock, as
//     exitwrapper.py does it): a second launcher never starts a second mpirun;
//  3. mpirun (the first of Spec.Mpirun found on PATH) runs with the marker's
//     descriptor inherited, with Spec.Args, or the Spec.ArgsFromMajor its
//     version asks for (`mpirun --version`, bounded: Open MPI 5's mpirun is
//     PRRTE's and takes other options than Open MPI 4's), its output appended to the log (never through a
//     link), SIGTERM, SIGINT and SIGHUP passed on to it;
//  4. its return code (negative: a signal, as Python's subprocess says it) is
//     written to the exit file atomically and the process exits with its status.
//
// A failure before mpirun ran is written to the termination message and the
// process exits with ErrorExit, writing no exit file.
package launch

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

const (
	// Version of the Spec this reads.
	Version = 1
	// ErrorExit is the exit code of a launch that failed before mpirun ran.
	ErrorExit = 2
	// Marker and Exit are the launch marker's and the exit file's names (exitwrapper.py).
	Marker = "mpirun.launch"
	Exit   = "mpirun.exit"
	// SpecMax bounds LAUNCH.json.
	SpecMax     = 1 << 20
	markerTries = 3
	// VersionTimeout and VersionMax bound `mpirun --version` (the image's program).
	VersionTimeout = 10 * time.Second
	VersionMax     = 64 << 10
	// Failed is what the prepare container writes beside LAUNCH.json when it
	// cannot write LAUNCH.json (its reason); SpecWait bounds the wait for either.
	Failed   = "failed"
	SpecWait = time.Hour
	specPoll = 10 * time.Millisecond
	// MessageMax bounds a failure's message (what the kubelet keeps of a
	// termination message; the prepare container writes Failed as long).
	MessageMax = 4000
)

// AwaitSpec waits until the spec at path, or Failed beside it, exists, for at
// most wait: a Failure naming the prepare container's reason, or nil once the
// spec is there.
func AwaitSpec(path string, wait time.Duration, sleep func(time.Duration)) *Failure {
	failed := filepath.Join(filepath.Dir(path), Failed)
	for waited := time.Duration(0); ; waited += specPoll {
		if _, err := os.Lstat(path); err == nil {
			return nil
		}
		if f, err := os.Open(failed); err == nil {
			why, _ := io.ReadAll(io.LimitReader(f, MessageMax))
			f.Close()
			return fail("the launcher's preparation failed: %s", strings.TrimSpace(string(why)))
		}
		if waited >= wait {
			return fail("no launch spec at %s after %s (the prepare container wrote none)", path, wait)
		}
		sleep(specPoll)
	}
}

// Spec is LAUNCH.json, written by the launcher pod's prepare container.
type Spec struct {
	Version int      `json:"version"`
	Mpirun  []string `json:"mpirun"`
	Args    []string `json:"args"`
	// ArgsFromMajor replaces Args for an Open MPI of that major version or later
	// (the key, in decimal; the largest one not above mpirun's version wins).
	ArgsFromMajor  map[string][]string `json:"args_from_major,omitempty"`
	Cwd            string              `json:"cwd"`
	Env            map[string]string   `json:"env"`
	Log            string              `json:"log"`
	Exit           string              `json:"exit"`
	TerminationLog string              `json:"termination_log"`
}

// ParseSpec reads and checks a Spec: every path absolute, an mpirun to look for.
func ParseSpec(data []byte) (*Spec, error) {
	var s Spec
	if err := json.Unmarshal(data, &s); err != nil {
		return nil, fmt.Errorf("not a launch spec: %v", err)
	}
	if s.Version != Version {
		return nil, fmt.Errorf("launch spec version %d, this launcher reads %d", s.Version, Version)
	}
	if len(s.Mpirun) == 0 {
		return nil, errors.New("the launch spec names no mpirun")
	}
	for _, p := range []string{s.Cwd, s.Log, s.Exit} {
		if !filepath.IsAbs(p) {
			return nil, fmt.Errorf("the launch spec's path %q is not absolute", p)
		}
	}
	if filepath.Base(s.Exit) != Exit {
		return nil, fmt.Errorf("the launch spec's exit file %q is not named %s", s.Exit, Exit)
	}
	for key := range s.ArgsFromMajor {
		if n, err := strconv.Atoi(key); err != nil || n < 1 || strconv.Itoa(n) != key {
			return nil, fmt.Errorf("the launch spec's args_from_major key %q is not a major version", key)
		}
	}
	return &s, nil
}

var openMPIVersion = regexp.MustCompile(`(?:\((?:Open MPI|OpenRTE)\) |Open MPI v)(\d+)\.`)

// OpenMPIMajor is the major version `mpirun --version` or `ompi_info --version`
// reports ("mpirun (Open MPI) 5.0.7"); ok false for any other text (MPICH's hydra).
func OpenMPIMajor(version string) (major int, ok bool) {
	m := openMPIVersion.FindStringSubmatch(version)
	if m == nil {
		return 0, false
	}
	major, err := strconv.Atoi(m[1])
	return major, err == nil
}

// ChooseArgs is mpirun's arguments for what `mpirun --version` said: those of
// the largest ArgsFromMajor key not above its Open MPI major version, else Args.
func ChooseArgs(s *Spec, version string) []string {
	major, ok := OpenMPIMajor(version)
	if !ok {
		return s.Args
	}
	best, args := 0, s.Args
	for key, a := range s.ArgsFromMajor {
		if n, _ := strconv.Atoi(key); n <= major && n > best {
			best, args = n, a
		}
	}
	return args
}

// MpirunVersion is what `mpirun --version` writes (at most VersionMax bytes,
// within VersionTimeout; empty if it fails to run).
func MpirunVersion(mpirun string, env []string) string {
	ctx, cancel := context.WithTimeout(context.Background(), VersionTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, mpirun, "--version")
	cmd.Env = env
	out := &limitedBuffer{max: VersionMax}
	cmd.Stdout, cmd.Stderr = out, out
	cmd.WaitDelay = time.Second
	_ = cmd.Run()
	return out.String()
}

type limitedBuffer struct {
	strings.Builder
	max int
}

func (b *limitedBuffer) Write(p []byte) (int, error) {
	room := b.max - b.Len()
	if len(p) <= room {
		return b.Builder.Write(p)
	}
	b.Builder.Write(p[:room])
	return room, errFull // (the pipe is closed: a program that writes on dies of SIGPIPE)
}

var errFull = errors.New("mpirun --version wrote too much")

// Status is the exit status for mpirun's return code: the code, a death by
// signal N (negative) as 128+N, at most 255.
func Status(returncode int) int {
	if returncode < 0 {
		return min(128-returncode, 255)
	}
	return min(returncode, 255)
}

func openRegular(path string, flags int, perm os.FileMode) (*os.File, error) {
	fd, err := syscall.Open(path, flags|syscall.O_NOFOLLOW|syscall.O_NONBLOCK|syscall.O_CLOEXEC, uint32(perm))
	if err != nil {
		if errors.Is(err, syscall.ELOOP) {
			return nil, fmt.Errorf("%s is a symbolic link: not opened", path)
		}
		return nil, &os.PathError{Op: "open", Path: path, Err: err}
	}
	var st syscall.Stat_t
	if err := syscall.Fstat(fd, &st); err != nil || st.Mode&syscall.S_IFMT != syscall.S_IFREG {
		syscall.Close(fd)
		return nil, fmt.Errorf("%s is not a regular file: not opened", path)
	}
	if err := syscall.SetNonblock(fd, false); err != nil {
		syscall.Close(fd)
		return nil, err
	}
	return os.NewFile(uintptr(fd), path), nil
}

// ReadExit is the code in an exit file; ok false if there is none, it does not
// parse, or it is not a regular file (a link is not followed).
func ReadExit(path string) (code int, ok bool) {
	f, err := openRegular(path, syscall.O_RDONLY, 0)
	if err != nil {
		return 0, false
	}
	defer f.Close()
	data, _ := io.ReadAll(io.LimitReader(f, 64))
	code, err = strconv.Atoi(strings.TrimSpace(string(data)))
	return code, err == nil
}

// WriteExit writes returncode into path atomically, replacing whatever stood
// there (a link is replaced, never followed).
func WriteExit(path string, returncode int) error {
	tmp := filepath.Join(filepath.Dir(path),
		fmt.Sprintf(".%s.%d.%d", filepath.Base(path), os.Getpid(), time.Now().UnixNano()))
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL|syscall.O_NOFOLLOW, 0o644)
	if err != nil {
		return err
	}
	_, werr := f.WriteString(strconv.Itoa(returncode) + "\n")
	cerr := f.Close()
	if werr == nil && cerr == nil {
		werr = os.Chmod(tmp, 0o644)
	}
	if werr == nil && cerr == nil {
		werr = os.Rename(tmp, path)
	}
	if werr != nil || cerr != nil {
		os.Remove(tmp)
		return errors.Join(werr, cerr)
	}
	return nil
}

// Begin creates and locks the marker in dir, holding "starting"; nil if another
// process holds it (it launched this simulation).
func Begin(dir string) (*os.File, error) {
	f, err := os.OpenFile(filepath.Join(dir, Marker), os.O_RDWR|os.O_CREATE|syscall.O_NOFOLLOW, 0o644)
	if err != nil {
		return nil, err
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, nil
		}
		return nil, err
	}
	if err := f.Truncate(0); err != nil {
		f.Close()
		return nil, err
	}
	if _, err := f.WriteAt([]byte("starting\n"), 0); err != nil {
		f.Close()
		return nil, err
	}
	return f, nil
}

// Launched records in the marker the process that holds its lock from now on.
func Launched(f *os.File, pid int) error {
	if err := f.Truncate(0); err != nil {
		return err
	}
	_, err := f.WriteAt([]byte(strconv.Itoa(pid)+"\n"), 0)
	return err
}

// State is ended | running | never | died, as exitwrapper.state says it.
func State(dir string) (string, error) {
	exitPath := filepath.Join(dir, Exit)
	if _, err := os.Lstat(exitPath); err == nil {
		return "ended", nil
	}
	f, err := os.OpenFile(filepath.Join(dir, Marker), os.O_RDONLY|syscall.O_NOFOLLOW, 0)
	if errors.Is(err, os.ErrNotExist) {
		return "never", nil
	} else if err != nil {
		return "", err
	}
	defer f.Close()
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return "running", nil
		}
		return "", err
	}
	buf := make([]byte, 64)
	n, _ := f.ReadAt(buf, 0)
	_ = syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
	if _, err := os.Lstat(exitPath); err == nil { // ended between the two looks
		return "ended", nil
	}
	text := strings.TrimSpace(string(buf[:n]))
	if text == "" || text == "starting" {
		return "never", nil
	}
	return "died", nil
}

// Failure is a launch that failed before mpirun ran.
type Failure struct {
	Message string
	Code    int
}

func (f *Failure) Error() string { return f.Message }

func fail(format string, args ...any) *Failure {
	return &Failure{Message: fmt.Sprintf(format, args...), Code: ErrorExit}
}

// Run is one launch: its surroundings are given so that tests drive it.
type Run struct {
	Spec    *Spec
	Environ []string
	Sleep   func(time.Duration)
	// Version is MpirunVersion unless a test gives another.
	Version func(mpirun string, env []string) string

	mu     sync.Mutex
	signum syscall.Signal
	child  *os.Process
}

// OnSignal passes a signal on to mpirun, or remembers it until mpirun starts.
func (r *Run) OnSignal(sig syscall.Signal) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.signum == 0 {
		r.signum = sig
	}
	if r.child != nil {
		_ = r.child.Signal(sig)
	}
}

func (r *Run) stopped() *Failure {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.signum != 0 {
		return &Failure{fmt.Sprintf("stopped by signal %d before mpirun started", int(r.signum)),
			128 + int(r.signum)}
	}
	return nil
}

func (r *Run) takeMarker(dir string) (string, *os.File, error) {
	for i := 0; i < markerTries; i++ {
		state, err := State(dir)
		if err != nil {
			return "", nil, err
		}
		if state != "never" {
			return state, nil, nil
		}
		f, err := Begin(dir)
		if err != nil {
			return "", nil, err
		}
		if f != nil {
			return state, f, nil
		}
		r.Sleep(100 * time.Millisecond)
	}
	return "running", nil, nil
}

// Env is mpirun's environment: this process's without LD_PRELOAD, then the spec's.
func Env(environ []string, extra map[string]string) []string {
	var env []string
	for _, kv := range environ {
		name, _, _ := strings.Cut(kv, "=")
		if _, over := extra[name]; name == "LD_PRELOAD" || over {
			continue
		}
		env = append(env, kv)
	}
	for k, v := range extra {
		env = append(env, k+"="+v)
	}
	return env
}

// LookMpirun is the first candidate found (a path, or a name on PATH in environ).
func LookMpirun(candidates []string, environ []string) (string, error) {
	path := ""
	for _, kv := range environ {
		if v, ok := strings.CutPrefix(kv, "PATH="); ok {
			path = v
		}
	}
	for _, c := range candidates {
		if strings.Contains(c, "/") {
			if st, err := os.Stat(c); err == nil && st.Mode().IsRegular() && st.Mode()&0o111 != 0 {
				return c, nil
			}
			continue
		}
		for _, dir := range filepath.SplitList(path) {
			p := filepath.Join(dir, c)
			if st, err := os.Stat(p); err == nil && st.Mode().IsRegular() && st.Mode()&0o111 != 0 {
				return p, nil
			}
		}
	}
	return "", fmt.Errorf("no %s in this image (PATH %s): the image must have its MPI's launcher on PATH",
		strings.Join(candidates, " or "), path)
}

// Execute runs mpirun once: its exit status, or a Failure if it never started.
func (r *Run) Execute() (int, error) {
	s := r.Spec
	if code, ok := ReadExit(s.Exit); ok { // it ran to its end already: never twice
		return Status(code), nil
	}
	mpirun, err := LookMpirun(s.Mpirun, r.Environ)
	if err != nil {
		return 0, fail("%v", err)
	}
	env := Env(r.Environ, s.Env)
	args := s.Args
	if len(s.ArgsFromMajor) > 0 {
		version := r.Version
		if version == nil {
			version = MpirunVersion
		}
		args = ChooseArgs(s, version(mpirun, env))
	}
	dir := filepath.Dir(s.Exit)
	state, marker, err := r.takeMarker(dir)
	if err != nil {
		return 0, fail("cannot take the launch marker in %s: %v", dir, err)
	}
	if marker == nil {
		return 0, fail("mpirun was launched already (the marker in %s says %s): not starting a second one", dir, state)
	}
	defer marker.Close()
	log, err := openRegular(s.Log, syscall.O_WRONLY|syscall.O_APPEND|syscall.O_CREAT, 0o644)
	if err != nil {
		return 0, fail("cannot open the log: %v", err)
	}
	defer log.Close()
	if f := r.stopped(); f != nil {
		return 0, f
	}
	cmd := exec.Command(mpirun, args...)
	cmd.Args[0] = mpirun
	cmd.Dir = s.Cwd
	cmd.Env = env
	cmd.Stdout, cmd.Stderr = log, log
	cmd.ExtraFiles = []*os.File{marker} // mpirun holds the launch lock too
	r.mu.Lock()
	err = cmd.Start()
	if err == nil {
		r.child = cmd.Process
		if r.signum != 0 { // it arrived while mpirun was being started
			_ = cmd.Process.Signal(r.signum)
		}
	}
	r.mu.Unlock()
	if err != nil {
		return 0, fail("cannot start mpirun: %v", err)
	}
	_ = Launched(marker, cmd.Process.Pid)
	_ = cmd.Wait()
	code := cmd.ProcessState.ExitCode()
	if ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		code = -int(ws.Signal())
	}
	_ = WriteExit(s.Exit, code) // (the container's exit code carries it too)
	return Status(code), nil
}

// Main is rankpack-launch LAUNCH.json.
func Main(args []string, stderr io.Writer) int {
	termination := "/dev/termination-log"
	failed := func(f *Failure) int {
		fmt.Fprintf(stderr, "rankpack-launch: %s\n", f.Message)
		msg := f.Message
		if len(msg) > MessageMax {
			msg = msg[:MessageMax]
		}
		_ = os.WriteFile(termination, []byte(msg), 0o644)
		return f.Code
	}
	if len(args) != 1 {
		fmt.Fprintln(stderr, "usage: rankpack-launch LAUNCH.json")
		return ErrorExit
	}
	if f := AwaitSpec(args[0], SpecWait, time.Sleep); f != nil {
		return failed(f)
	}
	f, err := os.Open(args[0])
	if err != nil {
		return failed(fail("cannot read the launch spec: %v", err))
	}
	data, err := io.ReadAll(io.LimitReader(f, SpecMax+1))
	f.Close()
	if err != nil || len(data) > SpecMax {
		return failed(fail("cannot read the launch spec %s (at most %d bytes)", args[0], SpecMax))
	}
	spec, err := ParseSpec(data)
	if err != nil {
		return failed(fail("%s: %v", args[0], err))
	}
	if spec.TerminationLog != "" {
		termination = spec.TerminationLog
	}
	run := &Run{Spec: spec, Environ: os.Environ(), Sleep: time.Sleep}
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP)
	go func() {
		for sig := range sigs {
			run.OnSignal(sig.(syscall.Signal))
		}
	}()
	status, err := run.Execute()
	var lf *Failure
	if errors.As(err, &lf) {
		return failed(lf)
	}
	return status
}
