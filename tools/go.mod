module rankpack.dev/tools

go 1.22
