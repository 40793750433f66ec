#!/bin/sh
# Prepare a 4-rank pitzDaily case (Debian OpenFOAM v1912) in DIR with END iterations.
#   bench/pitzdaily_case.sh DIR [END]
set -eu
dir=$1; end=${2:-200}
export WM_PROJECT_DIR=/usr/share/openfoam
rm -rf "$dir"; mkdir -p "$(dirname "$dir")"
cp -r /usr/share/doc/openfoam-examples/examples/incompressible/simpleFoam/pitzDaily "$dir"
find "$dir" -name '*.gz' -exec gunzip -f {} +
cat > "$dir/system/decomposeParDict" <<EOD
FoamFile { version 2.0; format ascii; class dictionary; object decomposeParDict; }
numberOfSubdomains 4;
method hierarchical;
hierarchicalCoeffs { n (4 1 1); order xyz; }
EOD
sed -i "s/^endTime .*/endTime $end;/; s/^writeInterval .*/writeInterval 100000;/" "$dir/system/controlDict"
(cd "$dir" && blockMesh > log.blockMesh 2>&1 && decomposePar -force > log.decomposePar 2>&1)
