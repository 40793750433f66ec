package keyexec

import (
	"bytes"
	"encoding/json"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

var key = []byte("0123456789abcdef")

func serve(t *testing.T) (string, *[]string) {
	t.Helper()
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var logged []string
	go Serve(ln, key, func(s string) { logged = append(logged, s) })
	t.Cleanup(func() { ln.Close() })
	return ln.Addr().String(), &logged
}

func run(t *testing.T, addr string, k []byte, command string) (int, string, string) {
	t.Helper()
	var out, errOut bytes.Buffer
	code := RunRemote(addr, k, command, &out, &errOut, 5*time.Second, func() bool { return false })
	return code, out.String(), errOut.String()
}

func TestTheCommandRunsWithItsOutputAndExitCode(t *testing.T) {
	addr, _ := serve(t)
	code, out, errOut := run(t, addr, key, "echo out; echo err >&2; exit 7")
	if code != 7 || out != "out\n" || errOut != "err\n" {
		t.Fatalf("code %d, out %q, err %q", code, out, errOut)
	}
}

func TestLargeOutputArrivesWhole(t *testing.T) {
	addr, _ := serve(t)
	code, out, _ := run(t, addr, key, "head -c 1000000 /dev/zero | tr '\\0' x")
	if code != 0 || len(out) != 1000000 || strings.Trim(out, "x") != "" {
		t.Fatalf("code %d, %d bytes", code, len(out))
	}
}

func TestAWrongKeyRunsNothing(t *testing.T) {
	addr, logged := serve(t)
	mark := filepath.Join(t.TempDir(), "ran")
	code, _, errOut := run(t, addr, []byte("wrong"), "touch "+mark)
	if code != 255 || !strings.Contains(errOut, "closed the connection") {
		t.Fatalf("code %d, err %q", code, errOut)
	}
	if _, err := os.Stat(mark); err == nil {
		t.Fatal("a caller without the key ran a command")
	}
	time.Sleep(50 * time.Millisecond)
	if len(*logged) != 1 || !strings.Contains((*logged)[0], "without the simulation's key") {
		t.Fatalf("logged %q", *logged)
	}
}

func TestARequestWithoutACommandOrTooLongIsClosed(t *testing.T) {
	addr, _ := serve(t)
	for _, line := range [][]byte{
		[]byte(`{"key": "0123456789abcdef"}` + "\n"),
		[]byte(`{"key": "0123456789abcdef", "command": 7}` + "\n"),
		append(bytes.Repeat([]byte("x"), HeaderMax+10), '\n'),
		[]byte("not json\n"),
	} {
		conn, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		conn.Write(line)
		conn.SetReadDeadline(time.Now().Add(5 * time.Second))
		n, err := conn.Read(make([]byte, 16))
		conn.Close()
		if n != 0 || err == nil {
			t.Fatalf("%.40q: answered %d bytes (%v)", line, n, err)
		}
	}
}

func TestADeathBySignalIs128PlusN(t *testing.T) {
	addr, _ := serve(t)
	if code, _, _ := run(t, addr, key, "kill -TERM $$"); code != 128+15 {
		t.Fatalf("code %d", code)
	}
}

func TestACallerThatGoesAwayTakesTheCommandDown(t *testing.T) {
	addr, _ := serve(t)
	pidFile := filepath.Join(t.TempDir(), "pid")
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	req, _ := json.Marshal(Request{Key: string(key), Command: "sleep 300 & echo $! > " + pidFile + "; wait"})
	conn.Write(append(req, '\n'))
	var pid int
	for i := 0; i < 100 && pid == 0; i++ {
		time.Sleep(50 * time.Millisecond)
		data, _ := os.ReadFile(pidFile)
		pid, _ = strconv.Atoi(strings.TrimSpace(string(data)))
	}
	if pid == 0 {
		t.Fatal("the command never started")
	}
	conn.Close()
	for i := 0; i < 100; i++ {
		if syscall.Kill(pid, 0) != nil {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("sleep %d still runs after its caller left", pid)
}

func TestNothingListeningIs255WithinTheConnectTime(t *testing.T) {
	ln, _ := net.Listen("tcp4", "127.0.0.1:0")
	addr := ln.Addr().String()
	ln.Close()
	var out, errOut bytes.Buffer
	t0 := time.Now()
	code := RunRemote(addr, key, "true", &out, &errOut, 500*time.Millisecond, func() bool { return false })
	if code != 255 || !strings.Contains(errOut.String(), "cannot reach") || time.Since(t0) > 3*time.Second {
		t.Fatalf("code %d after %v: %q", code, time.Since(t0), errOut.String())
	}
}

func TestTheKeyFileMustHoldAKey(t *testing.T) {
	path := filepath.Join(t.TempDir(), "key")
	os.WriteFile(path, []byte(" \n"), 0o600)
	if _, err := ReadKey(path); err == nil || !strings.Contains(err.Error(), "empty") {
		t.Fatalf("err %v", err)
	}
	os.WriteFile(path, []byte("abc\n"), 0o600)
	if k, err := ReadKey(path); err != nil || string(k) != "abc" {
		t.Fatalf("%q %v", k, err)
	}
}

func TestAProcessLeftRunningWithTheOutputDoesNotHoldTheExitCode(t *testing.T) {
	PumpGrace = time.Second
	defer func() { PumpGrace = 10 * time.Second }()
	addr, _ := serve(t)
	t0 := time.Now()
	code, out, _ := run(t, addr, key, "echo started; (sleep 30 &) ; exit 3")
	if code != 3 || out != "started\n" {
		t.Fatalf("code %d, out %q", code, out)
	}
	if d := time.Since(t0); d > PumpGrace+5*time.Second {
		t.Fatalf("the exit code came after %v", d)
	}
}

func TestAnArgvRunsWithoutAShellInItsDirectory(t *testing.T) {
	addr, _ := serve(t)
	dir := t.TempDir()
	var out, errOut bytes.Buffer
	argv := []string{"sh", "-c", `pwd; echo "$1" >&2; echo last`, "sh", "a; touch ran"}
	code := RunArgv(addr, key, argv, dir, &out, &errOut, 5*time.Second, func() bool { return false })
	if code != 0 || out.String() != dir+"\na; touch ran\nlast\n" || errOut.Len() != 0 {
		t.Fatalf("code %d, out %q, err %q", code, out.String(), errOut.String())
	}
	if _, err := os.Stat(filepath.Join(dir, "ran")); err == nil {
		t.Fatal("an argument was run as a command")
	}
	out.Reset()
	code = RunArgv(addr, key, []string{"no-such-program-here"}, "", &out, &errOut, 5*time.Second,
		func() bool { return false })
	if code != 127 || !strings.Contains(errOut.String(), "cannot start no-such-program-here") {
		t.Fatalf("code %d, err %q", code, errOut.String())
	}
}

func TestARequestWithBothACommandAndAnArgvIsClosed(t *testing.T) {
	addr, _ := serve(t)
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.Write([]byte(`{"key": "0123456789abcdef", "command": "true", "argv": ["true"]}` + "\n"))
	conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	if n, err := conn.Read(make([]byte, 16)); n != 0 || err == nil {
		t.Fatalf("answered %d bytes (%v)", n, err)
	}
}
