from rankpack.cli import entry

entry()
