// Package keyexec enters a rank pod with its simulation's key: the server
// (rankpack-rankd, a rank pod's process) and the client (rankpack-exec, the rsh
// agent mpirun runs in the launcher pod). Decision 0013 and docs/own-image.md.
// A staging pod uses the same pair on its loopback: rankpack-rankd in a sidecar
// of the Simulation's image runs the OpenFOAM commands its main container (in
// rankpack's image) sends with rankpack-exec, each an argv.
//
// The wire: the caller sends one line, {"key": K, "command": C} or
// {"key": K, "argv": [A...], "dir": D} (at most HeaderMax bytes); a wrong key
// closes the connection. C runs as /bin/sh -c C (Open MPI's orted command is
// written for a remote shell); an argv runs as it is, no shell (its first word
// found on the server's PATH), in D if given, its stderr merged into its stdout
// in order (a staging pod's OpenFOAM tools, whose words are the user's, and whose
// output is a log). Either runs in the server's environment (and working
// directory, but for D), stdin from /dev/null, in its own session.
// Its output comes back in frames (a type byte 'o' or 'e', a 4-byte big-endian
// length, the bytes), then an 'x' frame with its exit code (4 bytes, signed;
// a death by signal N is 128+N). A caller that goes away takes the command's
// process group down (SIGTERM, SIGKILL after KillAfter).
package keyexec

import (
	"bufio"
	"bytes"
	"crypto/subtle"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"sync"
	"syscall"
	"time"
)

const (
	// Port is where rankpack-rankd listens in a rank pod (keyed.PORT).
	Port = 8476
	// HeaderMax bounds the request line.
	HeaderMax = 64 << 10
	// KillAfter is the time between SIGTERM and SIGKILL for a command whose caller left.
	KillAfter = 5 * time.Second
	// HeaderTimeout bounds how long a caller may take to send its request.
	HeaderTimeout = 10 * time.Second
)

// PumpGrace is how long the command's output is still sent after it exited (a process it
// left running may hold its output open).
var PumpGrace = 10 * time.Second

// Request is the one line a caller sends for a shell command.
type Request struct {
	Key     string `json:"key"`
	Command string `json:"command"`
}

// ArgvRequest is the one line a caller sends for a program and its arguments.
type ArgvRequest struct {
	Key  string   `json:"key"`
	Argv []string `json:"argv"`
	Dir  string   `json:"dir,omitempty"`
}

// request is a Request or an ArgvRequest as read: a missing command is nil.
type request struct {
	Key     string   `json:"key"`
	Command *string  `json:"command"`
	Argv    []string `json:"argv"`
	Dir     string   `json:"dir"`
}

// command is what req runs: a shell for a command, else its argv; nil if it asks for
// neither or both.
func (req *request) command() *exec.Cmd {
	if (req.Command == nil) == (len(req.Argv) == 0) {
		return nil
	}
	var cmd *exec.Cmd
	if req.Command != nil {
		cmd = exec.Command("/bin/sh", "-c", *req.Command)
	} else {
		cmd = exec.Command(req.Argv[0], req.Argv[1:]...)
	}
	cmd.Dir = req.Dir
	return cmd
}

// ReadKey reads a key file: its content without surrounding white space, never empty.
func ReadKey(path string) ([]byte, error) {
	data, err := readBounded(path, 4096)
	if err != nil {
		return nil, err
	}
	key := bytes.TrimSpace(data)
	if len(key) == 0 {
		return nil, fmt.Errorf("the key file %s is empty", path)
	}
	return key, nil
}

func readBounded(path string, max int64) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return io.ReadAll(io.LimitReader(f, max))
}

// frameWriter sends frames on one connection from several goroutines.
type frameWriter struct {
	mu   sync.Mutex
	conn net.Conn
}

func (w *frameWriter) send(kind byte, data []byte) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	head := make([]byte, 5)
	head[0] = kind
	binary.BigEndian.PutUint32(head[1:], uint32(len(data)))
	_, err := w.conn.Write(append(head, data...))
	return err
}

func readLine(conn net.Conn, limit int) ([]byte, error) {
	var buf []byte
	chunk := make([]byte, 4096)
	for {
		if i := bytes.IndexByte(buf, '\n'); i >= 0 {
			return buf[:i], nil
		}
		n, err := conn.Read(chunk)
		if n > 0 {
			if len(buf)+n > limit {
				return nil, errors.New("request too long")
			}
			buf = append(buf, chunk[:n]...)
		}
		if err != nil {
			return nil, err
		}
	}
}

// ExitCode is a finished command's code as a shell says it: 128+N for a death by signal N.
func ExitCode(state *os.ProcessState) int {
	if ws, ok := state.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return 128 + int(ws.Signal())
	}
	return state.ExitCode()
}

func stopGroup(cmd *exec.Cmd, done <-chan struct{}) {
	pid := cmd.Process.Pid
	_ = syscall.Kill(-pid, syscall.SIGTERM)
	select {
	case <-done:
		return
	case <-time.After(KillAfter):
	}
	_ = syscall.Kill(-pid, syscall.SIGKILL)
}

// Session serves one caller: its key checked, its command run, its output and exit
// code sent. log receives a line for a refused caller.
func Session(conn net.Conn, key []byte, log func(string)) {
	defer conn.Close()
	_ = conn.SetReadDeadline(time.Now().Add(HeaderTimeout))
	line, err := readLine(conn, HeaderMax)
	var req request
	var cmd *exec.Cmd
	if err == nil && json.Unmarshal(line, &req) == nil {
		cmd = req.command()
	}
	if cmd == nil {
		log("rankpack-rankd: a caller sent no request; closed")
		return
	}
	if subtle.ConstantTimeCompare([]byte(req.Key), key) != 1 {
		log("rankpack-rankd: a caller without the simulation's key; closed")
		return
	}
	_ = conn.SetReadDeadline(time.Time{})
	w := &frameWriter{conn: conn}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	// pipes of our own: the command's end is closed here once it started, so that waiting
	// for the command does not wait for what it left running with its output (a daemon)
	stdout, outW, err1 := os.Pipe()
	stderr, errW, err2 := os.Pipe()
	if err1 != nil || err2 != nil {
		return
	}
	defer stdout.Close()
	defer stderr.Close()
	cmd.Stdout, cmd.Stderr = outW, errW
	if req.Command == nil {
		cmd.Stderr = outW // an argv's two streams as one, in order (a tool's log)
	}
	err = cmd.Start()
	outW.Close()
	errW.Close()
	if err != nil {
		_ = w.send('e', []byte(fmt.Sprintf("rankpack-rankd: cannot start %s: %v\n", cmd.Args[0], err)))
		_ = w.send('x', be32(127))
		return
	}
	var pumps sync.WaitGroup
	pump := func(r io.Reader, kind byte) {
		defer pumps.Done()
		buf := make([]byte, 65536)
		for {
			n, err := r.Read(buf)
			if n > 0 {
				_ = w.send(kind, buf[:n])
			}
			if err != nil {
				return
			}
		}
	}
	pumps.Add(2)
	go pump(stdout, 'o')
	go pump(stderr, 'e')
	done := make(chan struct{})
	go func() { // the caller going away ends the command
		buf := make([]byte, 4096)
		for {
			if _, err := conn.Read(buf); err != nil {
				break
			}
		}
		select {
		case <-done:
		default:
			stopGroup(cmd, done)
		}
	}()
	_ = cmd.Wait()
	close(done)
	drained := make(chan struct{})
	go func() { pumps.Wait(); close(drained) }()
	select { // its output up to now; not what a process it left behind writes later
	case <-drained:
	case <-time.After(PumpGrace):
	}
	_ = w.send('x', be32(int32(ExitCode(cmd.ProcessState))))
	if tcp, ok := conn.(*net.TCPConn); ok {
		_ = tcp.CloseWrite()
	}
}

func be32(v int32) []byte {
	b := make([]byte, 4)
	binary.BigEndian.PutUint32(b, uint32(v))
	return b
}

// Serve accepts callers on ln until it is closed, each in its own goroutine.
func Serve(ln net.Listener, key []byte, log func(string)) error {
	for {
		conn, err := ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return nil
			}
			return err
		}
		go Session(conn, key, log)
	}
}

// RunRemote runs command where address is served (a rank pod): its output to out and errOut,
// its exit code returned (255: the pod could not be reached within connectFor,
// refused the key, or the connection was lost). abandoned is asked between tries.
func RunRemote(address string, key []byte, command string, out, errOut io.Writer,
	connectFor time.Duration, abandoned func() bool) int {
	header, _ := json.Marshal(Request{Key: string(key), Command: command})
	return runRequest(address, header, out, errOut, connectFor, abandoned)
}

// RunArgv is RunRemote for a program and its arguments, run without a shell, in dir
// if it is not empty.
func RunArgv(address string, key []byte, argv []string, dir string, out, errOut io.Writer,
	connectFor time.Duration, abandoned func() bool) int {
	header, _ := json.Marshal(ArgvRequest{Key: string(key), Argv: argv, Dir: dir})
	return runRequest(address, header, out, errOut, connectFor, abandoned)
}

func runRequest(address string, header []byte, out, errOut io.Writer,
	connectFor time.Duration, abandoned func() bool) int {
	deadline := time.Now().Add(connectFor)
	var conn net.Conn
	for {
		c, err := net.DialTimeout("tcp", address, 5*time.Second)
		if err == nil {
			conn = c
			break
		}
		if time.Now().After(deadline) || abandoned() {
			fmt.Fprintf(errOut, "rankpack-exec: cannot reach %s: %v\n", address, err)
			return 255
		}
		time.Sleep(200 * time.Millisecond)
	}
	defer conn.Close()
	if _, err := conn.Write(append(header, '\n')); err != nil {
		fmt.Fprintf(errOut, "rankpack-exec: cannot send to %s: %v\n", address, err)
		return 255
	}
	r := bufio.NewReaderSize(conn, 65536)
	head := make([]byte, 5)
	for {
		if _, err := io.ReadFull(r, head); err != nil {
			fmt.Fprintf(errOut, "rankpack-exec: %s closed the connection (a wrong key?)\n", address)
			return 255
		}
		size := binary.BigEndian.Uint32(head[1:])
		data := make([]byte, size)
		if _, err := io.ReadFull(r, data); err != nil {
			fmt.Fprintf(errOut, "rankpack-exec: %s closed the connection mid-frame\n", address)
			return 255
		}
		switch head[0] {
		case 'x':
			if size != 4 {
				fmt.Fprintln(errOut, "rankpack-exec: a malformed exit frame")
				return 255
			}
			return int(int32(binary.BigEndian.Uint32(data)))
		case 'o':
			_, _ = out.Write(data)
		default:
			_, _ = errOut.Write(data)
		}
	}
}
