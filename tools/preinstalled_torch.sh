#!/usr/bin/env bash
# make test-preinstalled: the notebooks' first cell where the platform's torch is already there, as on Colab or Kaggle.
#
# A fresh Python 3.11 venv gets a torch that is NOT the Makefile's (torch==2.14.1, a CUDA build: the stand-in for the
# platform's), then, in an empty folder, the set-up cell's own source runs with labkit not importable (the bootstrap:
# git clone of LABKIT_REPO, labkit installed --no-deps, then labkit.platforms.setup installs the rest with torch
# pinned), then notebooks 00 and 02 run in quick mode from the clone. torch must still be 2.14.1 afterwards.
# The last line is one JSON document: torch before and after, seconds per step, each notebook's status.
#
# LABKIT_REPO: the repository the set-up cell clones (default: a snapshot of this working tree, tracked and untracked
# files that git does not ignore, committed in a temporary repository, so uncommitted work is what runs). Nothing here
# changes this repository's git state. PRE_PYTHON (python3.11), TORCH_STANDIN (torch==2.14.1), KEEP=1 keeps the temp
# folder (several GB: torch's CUDA libraries; otherwise only its logs and executed notebooks stay); a failed run
# keeps it all and says where. 10-20 minutes on 2 cores.
set -uo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
PRE_PYTHON=${PRE_PYTHON:-python3.11}
TORCH_STANDIN=${TORCH_STANDIN:-torch==2.14.1}
WANT_TORCH=${TORCH_STANDIN#torch==}
WORK=$(mktemp -d "${TMPDIR:-/tmp}/labkit-preinstalled.XXXXXX")
V=$WORK/venv/bin/python
RUN=$WORK/run  # the "notebook folder" the set-up cell runs in: it clones into $RUN/labkit-src
CLONE=$RUN/labkit-src
mkdir -p "$RUN" "$WORK/logs"
cd "$RUN"  # never beside a labkit/ folder: python -c puts the working directory first on sys.path
export LABKIT_CACHE=$WORK/cache JUPYTER_DATA_DIR=$WORK/jupyter PIP_DISABLE_PIP_VERSION_CHECK=1
unset VIRTUAL_ENV CONDA_PREFIX PYTHONPATH LABKIT_MODEL LABKIT_DEVICE

declare -A SECONDS_OF
STEPS=()
FAILED=""
step() {  # step NAME COMMAND...: timed, output to $WORK/logs/NAME.log; a failure is recorded and later steps skip
  local name=$1; shift
  STEPS+=("$name")
  if [ -n "$FAILED" ]; then SECONDS_OF[$name]=null; return 1; fi
  local t0=$SECONDS
  echo "== $name" >&2
  if "$@" >"$WORK/logs/$name.log" 2>&1; then SECONDS_OF[$name]=$((SECONDS - t0)); return 0; fi
  SECONDS_OF[$name]=$((SECONDS - t0))
  FAILED=$name
  echo "== $name FAILED; its last lines:" >&2
  tail -n 30 "$WORK/logs/$name.log" >&2
  return 1
}

# torch's own word (torch.__version__, "2.14.1+cu130" for PyPI's CUDA wheel) and pip's (its metadata: "2.14.1")
torch_version() { "$V" -c "import importlib.metadata as m, torch; print(torch.__version__, m.version('torch'))" \
  2>/dev/null || echo none none; }

snapshot() {  # this working tree as a git repository the set-up cell can clone offline
  "$PRE_PYTHON" - "$ROOT" "$WORK/repo" <<'EOF'
import os, shutil, subprocess, sys
root, dest = sys.argv[1], sys.argv[2]
files = subprocess.run(["git", "-C", root, "ls-files", "-co", "--exclude-standard", "-z"], check=True,
                       capture_output=True).stdout.decode().split("\0")
for rel in filter(None, files):
    src = os.path.join(root, rel)
    if os.path.isfile(src):  # a tracked file deleted in the working tree stays out
        os.makedirs(os.path.dirname(os.path.join(dest, rel)) or dest, exist_ok=True)
        shutil.copy2(src, os.path.join(dest, rel))
EOF
  git -C "$WORK/repo" init -q && git -C "$WORK/repo" add -A &&
    git -C "$WORK/repo" -c user.name=labkit -c user.email=labkit@localhost commit -q -m "working tree snapshot"
}

setup_cell() {  # the cell's source as labkit.platforms writes it, run by the venv's python in $RUN
  PYTHONPATH="$WORK/repo" "$PRE_PYTHON" -c \
    "import labkit.platforms as p; print(p.setup_cell('00_setup'))" >"$WORK/setup_cell.py" || return 1
  (cd "$RUN" && "$V" "$WORK/setup_cell.py")
}

notebooks_with_cell() {  # the clone's notebooks 00 and 02, built from their sources when they lack the set-up cell
  if grep -q "labkit.platforms.setup" "$CLONE/notebooks/00_setup.ipynb" "$CLONE/notebooks/02_fp16_bf16.ipynb"; then
    echo "the clone's notebooks carry the set-up cell"; return 0
  fi
  (cd "$CLONE" && "$V" -m tools.nbbuild 00_setup 02_fp16_bf16)
}

run_notebooks() { (cd "$CLONE" && LABKIT_QUICK=1 "$V" -m tools.run_notebooks --only 00 02 --build-dir "$WORK/build"); }

if [ -z "${LABKIT_REPO:-}" ]; then step snapshot snapshot; export LABKIT_REPO=$WORK/repo; fi
step venv "$PRE_PYTHON" -m venv "$WORK/venv"
step pip "$V" -m pip install -q --upgrade pip
step torch "$V" -m pip install -q "$TORCH_STANDIN"
TORCH_BEFORE=$(torch_version)
[ "${TORCH_BEFORE#* }" = "$WANT_TORCH" ] || { [ -n "$FAILED" ] || FAILED="torch ($TORCH_BEFORE, not $WANT_TORCH)"; }
step labkit_absent "$V" -c "import importlib.util, sys; sys.exit(importlib.util.find_spec('labkit') is not None)"
step setup_cell setup_cell
step notebooks_build notebooks_with_cell
step notebooks run_notebooks  # a failed notebook fails the step; summary.json says which
TORCH_AFTER=$(torch_version)
TORCH_CUDA=$("$V" -c "import torch; print(torch.version.cuda)" 2>/dev/null || echo none)

"$PRE_PYTHON" - "$WORK" "$TORCH_BEFORE" "$TORCH_AFTER" "$TORCH_CUDA" "$WANT_TORCH" "$FAILED" \
  "$(for s in "${STEPS[@]}"; do printf '%s=%s ' "$s" "${SECONDS_OF[$s]}"; done)" <<'EOF'
import json, pathlib, sys
work, before, after, cuda, want, failed, steps = sys.argv[1:8]
work = pathlib.Path(work)
summary = work / "build" / "summary.json"
notebooks = ({n["name"]: {"status": n["status"], "wall_s": n.get("wall_s")}
              for n in json.loads(summary.read_text())["notebooks"]} if summary.is_file() else {})
seconds = {k: (None if v == "null" else int(v)) for k, v in (s.split("=") for s in steps.split())}
cell = work / "logs" / "setup_cell.log"
ok = (not failed and before == after and before.split()[-1] == want and len(notebooks) == 2
      and all(n["status"] == "ok" for n in notebooks.values()))
print(json.dumps({"ok": ok, "torch_before": before, "torch_after": after, "torch_cuda": cuda, "failed_step": failed or None,
                  "seconds": seconds, "notebooks": notebooks,
                  "setup_cell_output": cell.read_text().splitlines()[-8:] if cell.is_file() else None,
                  "work": str(work)}))
sys.exit(0 if ok else 1)
EOF
rc=$?
if [ $rc -eq 0 ] && [ "${KEEP:-0}" != 1 ]; then  # the GBs go; the logs and the executed notebooks stay
  rm -rf "$WORK/venv" "$WORK/cache" "$WORK/run" "$WORK/repo"; echo "logs: $WORK/logs, $WORK/build" >&2
else echo "kept: $WORK (venv/, run/labkit-src, logs/, build/)" >&2; fi
exit $rc
