#!/usr/bin/env bash
# Prints the one version of this source tree, from git: the binaries'
# --version, the image tag, the chart's version and appVersion.
#
#   on a release tag vX.Y.Z              X.Y.Z
#   N commits after the last tag         X.Y.Z-N-g<commit>   (git describe)
#   a clone without any release tag      0.0.0-N-g<commit>   (N: commits in its history)
#   a work tree with changes             ...-dirty
#   no git at all (a source tarball)     $VERSION_FALLBACK, else 0.0.0-unknown
#
# Every form is a SemVer 2 version (Helm's chart version) and an OCI tag
# (no "+"). With --commit it prints the full commit hash instead (empty
# outside git), and with --date the commit's time in Unix seconds, for
# SOURCE_DATE_EPOCH (0 outside git).
set -euo pipefail
cd "$(dirname "$0")/.."

if ! git rev-parse --git-dir >/dev/null 2>&1; then
	case "${1:-}" in
	--commit) echo "" ;;
	--date) echo 0 ;;
	*) echo "${VERSION_FALLBACK:-0.0.0-unknown}" ;;
	esac
	exit 0
fi
case "${1:-}" in
--commit) git rev-parse HEAD; exit 0 ;;
--date) git log -1 --format=%ct HEAD; exit 0 ;;
esac

dirty=""
git diff --quiet HEAD -- 2>/dev/null || dirty="-dirty"
if d=$(git describe --tags --match 'v[0-9]*.[0-9]*.[0-9]*' --abbrev=7 2>/dev/null); then
	echo "${d#v}$dirty"
else
	echo "0.0.0-$(git rev-list --count HEAD)-g$(git rev-parse --short=7 HEAD)$dirty"
fi
