#!/usr/bin/env bash
# Compares two release listings (hack/release's output): every digest (the
# image index, each architecture's manifest and the chart's OCI manifest) and
# every checksum must be the same. Prints them side by side.
set -euo pipefail
a=$1 b=$2
digests() { grep -oE '(index|oci|linux/[a-z0-9]+) +sha256:[0-9a-f]{64}|^  [0-9a-f]{64}  [^ ]+' "$1" | sed 's/^ *//; s/  */ /g'; }
paste -d'\n' <(digests "$a" | sed 's/^/first:  /') <(digests "$b" | sed 's/^/second: /')
if [ "$(digests "$a")" != "$(digests "$b")" ] || [ -z "$(digests "$a")" ]; then
	echo "the two builds differ" >&2
	exit 1
fi
echo "the two builds are identical: $(digests "$a" | wc -l) digests and checksums"
