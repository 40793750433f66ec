package casefiles

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

func write(t *testing.T, path, text string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
}

var bounds = Options{Skip: []string{"processor", "log."}, MaxFiles: 100, MaxBytes: 1 << 20}

func TestFindListsTheCasesOfThatNameInTheFirstRootThatIsThere(t *testing.T) {
	root := t.TempDir()
	write(t, filepath.Join(root, "a/solverFoam/pitz/system/controlDict"), "x")
	write(t, filepath.Join(root, "b/pitz/system/controlDict.gz"), "x")
	write(t, filepath.Join(root, "c/pitz/constant/x"), "not a case")
	os.Symlink(filepath.Join(root, "a"), filepath.Join(root, "linked")) // not followed
	found, err := Find([]string{"", filepath.Join(root, "missing"), root}, "pitz")
	if err != nil || found.Root != root {
		t.Fatalf("%+v %v", found, err)
	}
	if strings.Join(found.Cases, " ") != "a/solverFoam/pitz b/pitz" {
		t.Fatalf("cases %q", found.Cases)
	}
	none, err := Find([]string{filepath.Join(root, "missing")}, "pitz")
	if err != nil || none.Root != "" || len(none.Cases) != 0 {
		t.Fatalf("%+v %v", none, err)
	}
}

func TestCopyCopiesFilesAndLinksInsideLeavingOutTheSkipped(t *testing.T) {
	src, dest := t.TempDir(), filepath.Join(t.TempDir(), "run")
	write(t, filepath.Join(src, "system/controlDict"), "application simpleFoam;")
	write(t, filepath.Join(src, "Allrun"), "#!/bin/sh\n")
	os.Chmod(filepath.Join(src, "Allrun"), 0o755)
	write(t, filepath.Join(src, "processor0/x"), "left out")
	write(t, filepath.Join(src, "log.blockMesh"), "left out")
	write(t, filepath.Join(src, "constant/sub/log.kept"), "kept: not at the top")
	os.Symlink("../system/controlDict", filepath.Join(src, "constant/dict"))
	done, err := Copy(src, dest, bounds)
	if err != nil || done.Files != 4 {
		t.Fatalf("%+v %v", done, err)
	}
	for rel, want := range map[string]string{
		"system/controlDict": "application simpleFoam;", "constant/dict": "application simpleFoam;",
		"constant/sub/log.kept": "kept: not at the top"} {
		data, err := os.ReadFile(filepath.Join(dest, rel))
		if err != nil || string(data) != want {
			t.Errorf("%s: %q %v", rel, data, err)
		}
	}
	if st, err := os.Lstat(filepath.Join(dest, "constant/dict")); err != nil || !st.Mode().IsRegular() {
		t.Errorf("a link is copied as its file: %v %v", st, err)
	}
	if st, _ := os.Stat(filepath.Join(dest, "Allrun")); st.Mode().Perm() != 0o755 {
		t.Errorf("Allrun's mode %v", st.Mode())
	}
	for _, rel := range []string{"processor0", "log.blockMesh"} {
		if _, err := os.Lstat(filepath.Join(dest, rel)); err == nil {
			t.Errorf("%s was copied", rel)
		}
	}
}

func TestCopyRefusesWhatACaseMayNotHold(t *testing.T) {
	outside := filepath.Join(t.TempDir(), "secret")
	write(t, outside, "secret")
	for name, c := range map[string]struct {
		make func(src string)
		opts Options
		said string
	}{
		"a link out": {func(src string) { os.Symlink(outside, filepath.Join(src, "token")) },
			bounds, "outside the case"},
		"a FIFO": {func(src string) { syscall.Mkfifo(filepath.Join(src, "fifo"), 0o644) },
			bounds, "is a FIFO"},
		"a broken link": {func(src string) { os.Symlink("nowhere", filepath.Join(src, "x")) },
			bounds, "broken symlink"},
		"a loop": {func(src string) { os.Symlink(".", filepath.Join(src, "d/again")) },
			bounds, "links back to a directory above it"},
		"too many files": {func(src string) { write(t, filepath.Join(src, "d/b"), "b") },
			Options{MaxFiles: 1, MaxBytes: 100}, "more than 1 files"},
		"too many bytes": {func(src string) { write(t, filepath.Join(src, "d/b"), "bbbb") },
			Options{MaxFiles: 10, MaxBytes: 3}, "holds more than"},
	} {
		src := t.TempDir()
		write(t, filepath.Join(src, "d/a"), "a")
		c.make(src)
		_, err := Copy(src, filepath.Join(t.TempDir(), "run"), c.opts)
		if err == nil || !strings.Contains(err.Error(), c.said) {
			t.Errorf("%s: %v", name, err)
		}
	}
}

func TestCopyNeverWritesThroughALinkInItsDestination(t *testing.T) {
	src, dest := t.TempDir(), t.TempDir()
	write(t, filepath.Join(src, "f"), "case")
	victim := filepath.Join(t.TempDir(), "victim")
	write(t, victim, "keep")
	os.Symlink(victim, filepath.Join(dest, "f"))
	if _, err := Copy(src, dest, bounds); err == nil {
		t.Fatal("copied through a link")
	}
	if data, _ := os.ReadFile(victim); string(data) != "keep" {
		t.Fatalf("victim %q", data)
	}
}

func TestWhichFindsAProgramOnPathOrSaysNone(t *testing.T) {
	bin := t.TempDir()
	write(t, filepath.Join(bin, "blockMesh"), "#!/bin/sh\n")
	os.Chmod(filepath.Join(bin, "blockMesh"), 0o755)
	t.Setenv("PATH", bin)
	var out, errOut bytes.Buffer
	if code := Main("which", []string{"blockMesh"}, &out, &errOut); code != 0 ||
		out.String() != filepath.Join(bin, "blockMesh")+"\n" {
		t.Fatalf("%d %q %q", code, out.String(), errOut.String())
	}
	out.Reset()
	if code := Main("which", []string{"simpleFoam"}, &out, &errOut); code != 1 || out.Len() != 0 {
		t.Fatalf("%d %q", code, out.String())
	}
	if code := Main("copy-case", []string{"only-one"}, &out, &errOut); code != ErrorExit ||
		!strings.Contains(errOut.String(), "usage") {
		t.Fatalf("%d %q", code, errOut.String())
	}
}
