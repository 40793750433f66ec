// Package casefiles is what a staging reads of a Simulation's own image, run there by
// the staging pod's sidecar (rankpack-rankd, in that image) for the staging's Python
// (in rankpack's image, which sees none of the image's files):
//
//	rankpack-tools which NAME
//	    the program NAME on the image's PATH, as an absolute path (exit 1: none);
//	rankpack-tools find-case NAME
//	    the image's tutorials (the first directory of $RANKPACK_FOAM_EXAMPLES,
//	    $FOAM_TUTORIALS and Debian's /usr/share/doc/openfoam-examples/examples) and
//	    the case directories named NAME below it: {"root": R, "cases": [REL...]}
//	    (root "": no tutorials);
//	rankpack-tools copy-case [--skip PREFIX]... --max-files N --max-bytes N SRC DEST
//	    the case SRC copied into DEST: {"files": N, "bytes": N}.
//
// The copy is rankpack.case.openfoam's copy_case as a confined staging does it: links
// are followed as shutil.copytree(symlinks=False) follows them, but only inside SRC;
// a FIFO, a device, a socket, a broken link, a link loop, more than MaxDepth levels or
// MaxEntries entries (rankpack.paths.check_tree), more than --max-files files or
// --max-bytes bytes (openfoam.MAX_CASE_FILES and MAX_CASE_BYTES) end it with a
// one-line message and ErrorExit; top-level names starting with a --skip are left
// out. Nothing is written through a link in DEST.
package casefiles

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
)

const (
	// ErrorExit is the exit code of a refused or failed call (its message on stderr).
	ErrorExit = 2
	// MaxDepth and MaxEntries bound a walk (rankpack.paths.MAX_CASE_DEPTH, MAX_CASE_ENTRIES).
	MaxDepth   = 64
	MaxEntries = 1_000_000
	// MaxFound is the most case directories find-case reports.
	MaxFound = 16
	// DebianExamples is where Debian's openfoam-examples puts the tutorials.
	DebianExamples = "/usr/share/doc/openfoam-examples/examples"
)

// Main runs the tool name ("which", "find-case", "copy-case") with args; its exit code.
func Main(name string, args []string, stdout, stderr io.Writer) int {
	var result any
	var err error
	switch name {
	case "which":
		if len(args) != 1 {
			err = errors.New("usage: rankpack-tools which NAME")
			break
		}
		found, lookErr := exec.LookPath(args[0])
		if lookErr != nil {
			fmt.Fprintf(stderr, "%s: not found on PATH\n", args[0])
			return 1
		}
		abs, _ := filepath.Abs(found)
		fmt.Fprintln(stdout, abs)
		return 0
	case "find-case":
		if len(args) != 1 {
			err = errors.New("usage: rankpack-tools find-case NAME")
			break
		}
		roots := []string{os.Getenv("RANKPACK_FOAM_EXAMPLES"), os.Getenv("FOAM_TUTORIALS"),
			DebianExamples}
		result, err = Find(roots, args[0])
	case "copy-case":
		result, err = copyMain(args)
	default:
		err = fmt.Errorf("no tool %q", name)
	}
	if err != nil {
		fmt.Fprintln(stderr, oneLine(err.Error()))
		return ErrorExit
	}
	data, _ := json.Marshal(result)
	fmt.Fprintln(stdout, string(data))
	return 0
}

func oneLine(s string) string {
	s = strings.ReplaceAll(s, "\n", " ")
	if len(s) > 400 {
		s = s[:400]
	}
	return s
}

type skips []string

func (s *skips) String() string     { return strings.Join(*s, ",") }
func (s *skips) Set(v string) error { *s = append(*s, v); return nil }

func copyMain(args []string) (any, error) {
	fl := flag.NewFlagSet("copy-case", flag.ContinueOnError)
	fl.SetOutput(io.Discard)
	var opts Options
	fl.Var((*skips)(&opts.Skip), "skip", "a top-level prefix left out")
	fl.IntVar(&opts.MaxFiles, "max-files", 0, "")
	fl.Int64Var(&opts.MaxBytes, "max-bytes", 0, "")
	if err := fl.Parse(args); err != nil || fl.NArg() != 2 || opts.MaxFiles < 1 || opts.MaxBytes < 1 {
		return nil, errors.New("usage: rankpack-tools copy-case [--skip PREFIX]... " +
			"--max-files N --max-bytes N SRC DEST")
	}
	return Copy(fl.Arg(0), fl.Arg(1), opts)
}

// Found is find-case's answer.
type Found struct {
	Root  string   `json:"root"`
	Cases []string `json:"cases"`
}

// Find is the first of roots that is a directory and the case directories named name
// below it (a directory whose system/ holds a controlDict*), relative to it, sorted;
// links to directories are not followed (as pathlib's "**" does not).
func Find(roots []string, name string) (Found, error) {
	found := Found{Cases: []string{}}
	for _, r := range roots {
		if st, err := os.Stat(r); r != "" && err == nil && st.IsDir() {
			found.Root = r
			break
		}
	}
	if found.Root == "" {
		return found, nil
	}
	entries := 0
	err := filepath.WalkDir(found.Root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			if p == found.Root {
				return err
			}
			return nil // (an unreadable directory: glob skips it too)
		}
		if entries++; entries > MaxEntries {
			return fmt.Errorf("the tutorials at %s hold more than %d files", found.Root, MaxEntries)
		}
		if !d.IsDir() || p == found.Root {
			return nil
		}
		rel, _ := filepath.Rel(found.Root, p)
		if d.Name() == name && isCase(p) && len(found.Cases) < MaxFound {
			found.Cases = append(found.Cases, rel)
		}
		if strings.Count(rel, string(filepath.Separator)) >= MaxDepth {
			return filepath.SkipDir
		}
		return nil
	})
	sort.Strings(found.Cases)
	return found, err
}

func isCase(dir string) bool {
	items, err := os.ReadDir(filepath.Join(dir, "system"))
	if err != nil {
		return false
	}
	for _, it := range items {
		if strings.HasPrefix(it.Name(), "controlDict") {
			return true
		}
	}
	return false
}

// Options bound a copy.
type Options struct {
	Skip     []string
	MaxFiles int
	MaxBytes int64
}

// Copied is copy-case's answer.
type Copied struct {
	Files int   `json:"files"`
	Bytes int64 `json:"bytes"`
}

type copier struct {
	opts    Options
	top     string // src with its links resolved
	shown   string
	entries int
	done    Copied
}

// Copy copies the case at src into dest (made if missing); what it copied.
func Copy(src, dest string, opts Options) (Copied, error) {
	c := &copier{opts: opts, shown: shown(src)}
	top, err := filepath.EvalSymlinks(src)
	if err != nil {
		return c.done, fmt.Errorf("case %s cannot be read (%v)", c.shown, cause(err))
	}
	st, err := os.Stat(top)
	if err != nil || !st.IsDir() {
		return c.done, fmt.Errorf("case %s is not a directory", c.shown)
	}
	c.top = top
	if err := os.MkdirAll(dest, 0o755); err != nil {
		return c.done, fmt.Errorf("cannot make %s (%v)", dest, cause(err))
	}
	err = c.walk(src, dest, map[[2]uint64]bool{devIno(st): true}, true)
	return c.done, err
}

func (c *copier) walk(dir, dest string, ancestors map[[2]uint64]bool, top bool) error {
	if len(ancestors) > MaxDepth {
		return fmt.Errorf("case %s nests directories more than %d deep at %s", c.shown, MaxDepth, dir)
	}
	items, err := os.ReadDir(dir)
	if err != nil {
		return fmt.Errorf("case %s: cannot read %s (%v)", c.shown, dir, cause(err))
	}
	for _, it := range items {
		if top && c.skipped(it.Name()) {
			continue
		}
		if c.entries++; c.entries > MaxEntries {
			return fmt.Errorf("case %s has more than %d files; is it a case directory?",
				c.shown, MaxEntries)
		}
		if err := c.entry(filepath.Join(dir, it.Name()), filepath.Join(dest, it.Name()),
			it.Type()&fs.ModeSymlink != 0, ancestors); err != nil {
			return err
		}
	}
	return nil
}

func (c *copier) entry(p, dest string, link bool, ancestors map[[2]uint64]bool) error {
	st, err := os.Stat(p)
	if err != nil {
		if errors.Is(err, syscall.ELOOP) {
			return fmt.Errorf("case %s: %s is a symlink loop", c.shown, p)
		}
		if link {
			return fmt.Errorf("case %s: %s is a broken symlink; remove it or fix its target", c.shown, p)
		}
		return fmt.Errorf("case %s: cannot read %s (%v)", c.shown, p, cause(err))
	}
	if link {
		target, err := filepath.EvalSymlinks(p)
		if err != nil || (target != c.top && !strings.HasPrefix(target, c.top+"/")) {
			return fmt.Errorf("%s in case %s is a link to %s, outside the case; copy the file "+
				"into the case instead", p, c.shown, target)
		}
	}
	switch {
	case st.IsDir():
		key := devIno(st)
		if ancestors[key] {
			return fmt.Errorf("case %s: %s links back to a directory above it (a symlink loop)",
				c.shown, p)
		}
		if err := os.Mkdir(dest, st.Mode().Perm()|0o700); err != nil {
			return fmt.Errorf("cannot make %s (%v)", dest, cause(err))
		}
		inner := make(map[[2]uint64]bool, len(ancestors)+1)
		for k := range ancestors {
			inner[k] = true
		}
		inner[key] = true
		return c.walk(p, dest, inner, false)
	case st.Mode().IsRegular():
		return c.file(p, dest, st)
	case st.Mode()&fs.ModeNamedPipe != 0:
		return fmt.Errorf("case %s: %s is a FIFO; a case holds only files and directories", c.shown, p)
	default:
		return fmt.Errorf("case %s: %s is a special file; a case holds only files and directories",
			c.shown, p)
	}
}

func (c *copier) file(p, dest string, st fs.FileInfo) error {
	if c.done.Files++; c.done.Files > c.opts.MaxFiles {
		return c.tooBig()
	}
	in, err := os.Open(p)
	if err != nil {
		return fmt.Errorf("case %s: cannot read %s (%v)", c.shown, p, cause(err))
	}
	defer in.Close()
	out, err := os.OpenFile(dest, os.O_WRONLY|os.O_CREATE|os.O_EXCL|syscall.O_NOFOLLOW,
		st.Mode().Perm())
	if err != nil {
		return fmt.Errorf("cannot write %s (%v)", dest, cause(err))
	}
	left := c.opts.MaxBytes - c.done.Bytes
	n, err := io.Copy(out, io.LimitReader(in, left+1))
	if closeErr := out.Close(); err == nil {
		err = closeErr
	}
	c.done.Bytes += n
	if err != nil {
		return fmt.Errorf("cannot copy %s (%v)", p, cause(err))
	}
	if n > left {
		return c.tooBig()
	}
	_ = os.Chtimes(dest, st.ModTime(), st.ModTime())
	return nil
}

func (c *copier) tooBig() error {
	return fmt.Errorf("%s holds more than %d files or %d GiB; give the case without its "+
		"results (time directories, processor*)", c.shown, c.opts.MaxFiles, c.opts.MaxBytes>>30)
}

func (c *copier) skipped(name string) bool {
	for _, s := range c.opts.Skip {
		if strings.HasPrefix(name, s) {
			return true
		}
	}
	return false
}

func devIno(st fs.FileInfo) [2]uint64 {
	if s, ok := st.Sys().(*syscall.Stat_t); ok {
		return [2]uint64{uint64(s.Dev), s.Ino}
	}
	return [2]uint64{}
}

// shown is path quoted for a message, as rankpack.quantities.literal quotes it.
func shown(path string) string {
	clean := []rune{}
	for _, r := range path {
		if r < 0x20 || r == 0x7f || r == '{' || r == '}' {
			r = '?'
		}
		clean = append(clean, r)
	}
	if len(clean) > 80 {
		clean = append(clean[:77], []rune("...")...)
	}
	return "'" + string(clean) + "'"
}

// cause is an error without the operation and path os puts before it.
func cause(err error) error {
	var pe *fs.PathError
	if errors.As(err, &pe) {
		return pe.Err
	}
	return err
}
