#!/usr/bin/env bash
# Prints the path of a Python >= 3.12 interpreter (Django 6 needs it), or says what to install.
set -u
candidates=()
for v in 3.13 3.12; do
  command -v "python$v" >/dev/null 2>&1 && candidates+=("$(command -v "python$v")")
done
if command -v pyenv >/dev/null 2>&1; then
  root=$(pyenv root)
  for v in 3.13 3.12; do
    c=$(ls -d "$root"/versions/"$v".*/bin/python"$v" 2>/dev/null | sort -V | tail -1)
    [ -n "$c" ] && candidates+=("$c")
  done
fi
command -v python3 >/dev/null 2>&1 && candidates+=("$(command -v python3)")
for c in "${candidates[@]}"; do
  if "$c" -c 'import sys, venv; sys.exit(0 if sys.version_info >= (3, 12) else 1)' 2>/dev/null; then
    echo "$c"
    exit 0
  fi
done
cat >&2 <<'MSG'
GPU Portal needs Python 3.12 or newer (Django 6 does not install on older versions), and none was found.
Install one of:
  Debian 13 / Ubuntu 24.04:  apt-get install python3 python3-venv
  Debian 12 / Ubuntu 22.04:  pyenv install 3.12   (https://github.com/pyenv/pyenv)
  macOS (Homebrew):          brew install python@3.12
then run the command again.
MSG
exit 1
