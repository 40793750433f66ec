// Command rankpack-tools is rankpack's tools for a Simulation's own image, one
// static binary (no libc, no Python): called as rankpack-rankd, rankpack-exec
// or rankpack-launch (a link of that name), or as rankpack-tools NAME ARGS.
//
// A staging pod's sidecar runs rankpack-tools rankd KEY --loopback, and the
// staging's Python sends it argvs with rankpack-tools exec --argv; besides the
// image's OpenFOAM tools, those run rankpack-tools which, find-case and
// copy-case (package casefiles): what the Python would read of the image.
package main

import (
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"rankpack.dev/tools/casefiles"
	"rankpack.dev/tools/keyexec"
	"rankpack.dev/tools/launch"
)

const (
	keyDir  = "/etc/rankpack/sim"
	keyItem = "key"
	// envKey and envHosts: the key file and the rank pods' addresses (rsh.py's names).
	envKey   = "RANKPACK_RANKD_KEY"
	envHosts = "RANKPACK_RANKD_HOSTS"
	// envPort: where rankpack-rankd listens, if not keyexec.Port (tests on one host).
	envPort = "RANKPACK_RANKD_PORT"
	// connectRetry is how long an unreachable rank pod is tried again (rsh.CONNECT_RETRY_S).
	connectRetry = 180 * time.Second
	hostsMax     = 1 << 20
)

func main() {
	name := filepath.Base(os.Args[0])
	args := os.Args[1:]
	if name == "rankpack-tools" {
		if len(args) == 0 {
			fmt.Fprintln(os.Stderr, "usage: rankpack-tools rankd|exec|launch|which|find-case|copy-case ARGS...")
			os.Exit(2)
		}
		name, args = "rankpack-"+args[0], args[1:]
	}
	switch name {
	case "rankpack-rankd":
		os.Exit(rankd(args))
	case "rankpack-exec":
		os.Exit(agent(args))
	case "rankpack-launch":
		os.Exit(launch.Main(args, os.Stderr))
	case "rankpack-which", "rankpack-find-case", "rankpack-copy-case":
		os.Exit(casefiles.Main(strings.TrimPrefix(name, "rankpack-"), args, os.Stdout, os.Stderr))
	default:
		fmt.Fprintf(os.Stderr, "rankpack-tools: no tool %q (rankd, exec, launch, which, "+
			"find-case, copy-case)\n", name)
		os.Exit(2)
	}
}

// rankd is rankpack-rankd [KEY_FILE] [--port N] [--loopback]: a rank pod's process (on
// every address), or a staging pod's sidecar (--loopback: on 127.0.0.1 only, for the
// pod's own containers); ends at SIGTERM or SIGINT.
func rankd(args []string) int {
	path, port, host := filepath.Join(keyDir, keyItem), keyexec.Port, ""
	for i := 0; i < len(args); i++ {
		if args[i] == "--loopback" {
			host = "127.0.0.1"
			continue
		}
		if args[i] == "--port" && i+1 < len(args) {
			p, err := strconv.Atoi(args[i+1])
			if err != nil || p <= 0 || p > 65535 {
				fmt.Fprintf(os.Stderr, "rankpack-rankd: --port %q is not a port\n", args[i+1])
				return 2
			}
			port = p
			i++
			continue
		}
		path = args[i]
	}
	key, err := keyexec.ReadKey(path)
	if err != nil {
		fmt.Fprintf(os.Stderr, "rankpack-rankd: cannot read the simulation's key: %v\n", err)
		return 2
	}
	ln, err := net.Listen("tcp4", net.JoinHostPort(host, strconv.Itoa(port)))
	if err != nil {
		fmt.Fprintf(os.Stderr, "rankpack-rankd: cannot listen: %v\n", err)
		return 1
	}
	fmt.Fprintf(os.Stderr, "rankpack-rankd: listening on %s\n", ln.Addr())
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT)
	go func() {
		<-sigs
		ln.Close()
	}()
	if err := keyexec.Serve(ln, key, func(s string) { fmt.Fprintln(os.Stderr, s) }); err != nil {
		fmt.Fprintf(os.Stderr, "rankpack-rankd: %v\n", err)
		return 1
	}
	return 0
}

// splitArgs is [opts...] HOST CMD... -> (HOST, the command for sh -c).
func splitArgs(args []string) (string, string, bool) {
	for len(args) > 0 && strings.HasPrefix(args[0], "-") {
		args = args[1:] // ssh-style options: meaningless here
	}
	if len(args) < 2 {
		return "", "", false
	}
	return args[0], strings.Join(args[1:], " "), true
}

// agent is rankpack-exec HOST CMD...: mpirun's rsh agent in the launcher pod; or
// rankpack-exec --argv [--dir DIR] HOST ARG...: ARG... run as they are (no shell), in DIR.
func agent(args []string) int {
	if len(args) > 0 && args[0] == "--argv" {
		return argvAgent(args[1:])
	}
	host, command, ok := splitArgs(args)
	if !ok {
		fmt.Fprintln(os.Stderr, "usage: rankpack-exec POD COMMAND...")
		return 255
	}
	address, key, ok := target(host)
	if !ok {
		return 255
	}
	parent := os.Getppid()
	return keyexec.RunRemote(address, key, command, os.Stdout, os.Stderr, connectRetry,
		func() bool { return os.Getppid() != parent }) // mpirun died: it waits for nothing
}

func argvAgent(args []string) int {
	dir := ""
	if len(args) > 1 && args[0] == "--dir" {
		dir, args = args[1], args[2:]
	}
	if len(args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: rankpack-exec --argv [--dir DIR] HOST PROGRAM [ARG...]")
		return 255
	}
	address, key, ok := target(args[0])
	if !ok {
		return 255
	}
	parent := os.Getppid()
	return keyexec.RunArgv(address, key, args[1:], dir, os.Stdout, os.Stderr, connectRetry,
		func() bool { return os.Getppid() != parent }) // its caller died: nobody waits
}

// target is host's address (from the hosts file) and the key, or false (said on stderr).
func target(host string) (string, []byte, bool) {
	key, err := keyexec.ReadKey(os.Getenv(envKey))
	var ip string
	if err == nil {
		ip, err = hostIP(os.Getenv(envHosts), host)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "rankpack-exec: %s: no address or key for it: %v\n", host, err)
		return "", nil, false
	}
	port := strconv.Itoa(keyexec.Port)
	if p := os.Getenv(envPort); p != "" {
		port = p
	}
	return net.JoinHostPort(ip, port), key, true
}

func hostIP(path, host string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, hostsMax))
	if err != nil {
		return "", err
	}
	var hosts map[string]string
	if err := json.Unmarshal(data, &hosts); err != nil {
		return "", fmt.Errorf("%s: %v", path, err)
	}
	ip, ok := hosts[host]
	if !ok || net.ParseIP(ip) == nil {
		return "", fmt.Errorf("%s names no address for it", path)
	}
	return ip, nil
}
