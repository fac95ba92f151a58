#!/usr/bin/env bash
# Installs voxcpm without its declared dependencies (requirements.txt lists the ones inference imports) and
# satisfies its module-level `import torchaudio` (voxcpm/model/voxcpm.py, the VoxCPM1 model we never run).
# No PyPI torchaudio is built for torch 2.13: 2.11.1's C++ extension fails to load against it. torchaudio's
# loader treats a missing extension as supported (`_load_lib` returns False, only the C++-backed ops are then
# unavailable), so we install its Python package and remove the mismatched shared libraries.
set -euo pipefail
python=$1
log=$(mktemp)
if ! "$python" -m pip install -q --no-deps voxcpm==2.0.3 torchaudio==2.11.1 >"$log" 2>&1; then
    grep -v "is ignored" "$log"
    exit 1
fi
rm -f "$log"
site=$("$python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
rm -f "$site"/torchaudio/lib/*.so
"$python" -c "import voxcpm, torchaudio.functional" || { echo "post_install: voxcpm does not import" >&2; exit 1; }
