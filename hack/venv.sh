#!/usr/bin/env bash
# Creates (or refreshes) the virtualenv with the pinned dependency set of constraints.txt.
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=hack/lib.sh
. "$HERE/lib.sh"
PYTHON="${1:-python3.11}"
VENV="${2:-.venv}"
need_cmd "$PYTHON" "capl needs Python 3.11"
"$PYTHON" -c 'import sys; assert sys.version_info[:2] == (3, 11)' 2>/dev/null ||
	die "$PYTHON is $("$PYTHON" --version 2>&1); capl needs Python 3.11"
if [ ! -x "$VENV/bin/python" ]; then
	note "creating $VENV"
	"$PYTHON" -m venv "$VENV" || die "python venv failed (on Debian: apt-get install python3-venv)"
fi
note "installing pinned dependencies into $VENV"
"$VENV/bin/pip" install -q --disable-pip-version-check -c constraints.txt -e '.[dev]' >/tmp/capl-pip.log 2>&1 ||
	{ tail -n 20 /tmp/capl-pip.log >&2; die "pip install failed (full log: /tmp/capl-pip.log)"; }
