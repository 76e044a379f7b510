# shellcheck shell=bash
# Sourced by the build scripts that assemble file trees from Debian bookworm
# packages (the real NVIDIA driver userspace, the images' runtime base). The
# packages are only downloaded and unpacked with `dpkg -x` into a directory of
# the caller's: nothing is ever installed into the machine's /.
#
# NVIDIA's driver userspace is in Debian's non-free component, which a
# bookworm machine usually does not list, so debs_ensure_non_free adds one
# apt source for it (Debian's own archive and key) when it is missing.
# See shared/notes/real-driver-userspace.md.

DEBS_SOURCE=/etc/apt/sources.list.d/gpuaas-debian-non-free.sources
# The .deb files are kept here across builds, so a rebuild needs no network.
DEBS_CACHE="${DEBS_CACHE:-$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)/_output/debs}"

debs_as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }

# debs_stamp_current STAMP WANT CHECKFILE succeeds when a build is up to
# date: its stamp file STAMP holds WANT (the hash of what the build is made
# from, written last by the build) and CHECKFILE, a file the build makes,
# still exists.
debs_stamp_current() { [ -f "$1" ] && [ "$(cat "$1")" = "$2" ] && [ -e "$3" ]; }

# debs_apt runs apt-get, waiting for the dpkg lock that another build (or
# the machine's own apt) may hold. `apt-get update` takes the lists lock,
# which the timeout does not cover, so update is retried a few times.
debs_apt() {
	local try
	for try in 1 2 3 4 5 6; do
		debs_as_root apt-get -q -o DPkg::Lock::Timeout=120 "$@" && return 0
		[ "$1" = update ] || return 1
		echo "apt-get update failed (try $try; apt busy?), retrying in 20s" >&2
		sleep 20
	done
	return 1
}

# debs_mirror prints the URI of the machine's Debian main archive (not the
# security one), so the added source uses the same mirror.
debs_mirror() {
	local uri=""
	if [ -f /etc/apt/sources.list.d/debian.sources ]; then
		# deb822 stanzas: the first one whose Suites has plain bookworm.
		uri=$(awk '
			/^[[:space:]]*#/ { next }
			/^[[:space:]]*$/ { if (s && u != "") { print u; exit } s = 0; u = ""; next }
			tolower($1) == "uris:" { u = $2 }
			tolower($1) == "suites:" { for (i = 2; i <= NF; i++) if ($i == "bookworm") s = 1 }
			END { if (s && u != "") print u }' /etc/apt/sources.list.d/debian.sources | head -n1)
	fi
	if [ -z "$uri" ] && [ -f /etc/apt/sources.list ]; then
		uri=$(awk '$1 == "deb" && $3 == "bookworm" { print $2; exit }' /etc/apt/sources.list)
	fi
	echo "${uri:-http://deb.debian.org/debian}"
}

# debs_ensure_non_free makes sure apt knows bookworm's non-free component.
# It writes the source only when it is missing or differs, and returns 0 if
# it did (the package lists then need an update), 1 if nothing changed.
debs_ensure_non_free() {
	local want
	want="Types: deb
URIs: $(debs_mirror)
Suites: bookworm
Components: non-free
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg"
	if [ -f "$DEBS_SOURCE" ] && [ "$(cat "$DEBS_SOURCE")" = "$want" ]; then
		return 1
	fi
	echo "adding apt source $DEBS_SOURCE (bookworm non-free)"
	printf '%s\n' "$want" | debs_as_root tee "$DEBS_SOURCE" >/dev/null
	return 0
}

# debs_known PKG[=VERSION] succeeds when apt's lists have that package.
debs_known() {
	local name=${1%%=*} version=""
	[[ $1 == *=* ]] && version=${1#*=}
	if [ -n "$version" ]; then
		# The version may be a glob (535.261.03-*): compare each known one.
		local v
		while read -r v; do
			# shellcheck disable=SC2053 # the version is a pattern on purpose
			[[ $v == $version ]] && return 0
		done < <(debs_versions "$name")
		return 1
	fi
	[ -n "$(debs_versions "$name")" ]
}

# debs_versions PKG prints the versions apt knows of PKG, newest first.
debs_versions() {
	apt-cache madison "$1" 2>/dev/null | awk -F' [|] ' -v p="$1" '{ gsub(/ /, "", $1); gsub(/ /, "", $2) } $1 == p { print $2 }' |
		sort -urV
}

# debs_lists_for PKG... refreshes apt's lists (once) if the non-free source
# was just added or any of the packages is unknown.
debs_lists_for() {
	local added=0 p
	debs_ensure_non_free && added=1
	if [ "$added" = 0 ]; then
		for p in "$@"; do
			debs_known "$p" || { added=1; break; }
		done
	fi
	[ "$added" = 0 ] || debs_apt update -qq
}

# debs_cached PKG VERSION-GLOB prints the newest cached .deb of PKG whose
# version matches the glob, if any (dpkg names them pkg_version_arch.deb,
# with an epoch's colon written %3a).
# PKG may be qualified with an architecture (libc6:arm64); otherwise the
# machine's own architecture (or all) is meant.
debs_cached() {
	local name=${1%%:*} arch version=$2 f v best=""
	arch=$([[ $1 == *:* ]] && echo "${1#*:}" || dpkg --print-architecture)
	for f in "$DEBS_CACHE/${name}_"*.deb; do
		[ -f "$f" ] || continue
		case "$f" in *"_${arch}.deb" | *_all.deb) ;; *) continue ;; esac
		v=${f##*/}
		v=${v#"${name}_"}
		v=${v%_*.deb}
		v=${v//%3a/:}
		# shellcheck disable=SC2053 # the version is a pattern on purpose
		[[ $v == $version ]] || continue
		if [ -z "$best" ] || [ "$(printf '%s\n%s\n' "$best" "$v" | sort -V | tail -n1)" = "$v" ]; then
			best=$v
		fi
	done
	[ -n "$best" ] || return 0
	for f in "$DEBS_CACHE/${name}_${best//:/%3a}_${arch}.deb" "$DEBS_CACHE/${name}_${best//:/%3a}_all.deb"; do
		[ -f "$f" ] && { echo "$f"; return 0; }
	done
}

# debs_fetch DEST PKG[=VERSION]... downloads exactly the named packages (no
# dependencies: the caller lists what it needs) into the cache, unless a
# matching .deb is already there, and unpacks each into DEST with dpkg -x.
# VERSION may be exact or a glob (535.261.03-*: the newest match); without
# one, apt's candidate version is used. PKG may name another architecture
# (libc6:arm64; dpkg --add-architecture must list it). With DEBS_STATUS_DIR
# set, each package's control fields are written there, one file a package.
debs_fetch() {
	local dest=$1 spec name version deb
	shift
	mkdir -p "$DEBS_CACHE" "$dest"
	local debs=() missing=()
	# A pinned package already in the cache needs no apt at all.
	for spec in "$@"; do
		[[ $spec == *=* ]] || { missing+=("$spec"); continue; }
		deb=$(debs_cached "${spec%%=*}" "${spec#*=}") || true
		if [ -n "$deb" ]; then debs+=("$deb"); else missing+=("$spec"); fi
	done
	if [ ${#missing[@]} -gt 0 ]; then
		debs_lists_for "${missing[@]}"
		for spec in "${missing[@]}"; do
			name=${spec%%=*}
			if [[ $spec == *=* ]]; then
				version=${spec#*=}
				if [[ $version == *[*?[]* ]]; then
					local v
					version=""
					while read -r v; do
						# shellcheck disable=SC2053 # the version is a pattern on purpose
						[[ $v == ${spec#*=} ]] && { version=$v; break; }
					done < <(debs_versions "$name")
				fi
			else
				version=$(apt-cache policy "$name" | awk '$1 == "Candidate:" { print $2 }')
			fi
			if [ -z "$version" ] || [ "$version" = "(none)" ]; then
				echo "debs_fetch: no package $spec in apt's lists" >&2
				return 1
			fi
			deb=$(debs_cached "$name" "$version") || true
			if [ -z "$deb" ]; then
				echo "downloading $name=$version"
				# Downloading needs no root. As root, apt would drop to the
				# _apt user, who cannot write our cache; apt checks the
				# hash against the signed lists either way.
				local sandbox=()
				[ "$(id -u)" != 0 ] || sandbox=(-o APT::Sandbox::User=root)
				(cd "$DEBS_CACHE" && apt-get -q "${sandbox[@]}" download -qq "$name=$version")
				deb=$(debs_cached "$name" "$version")
			fi
			debs+=("$deb")
		done
	fi
	for deb in "${debs[@]}"; do
		dpkg -x "$deb" "$dest"
		# What was unpacked, as distroless records it (one control file
		# per package): SBOM tools and scanners read it in the image.
		if [ -n "${DEBS_STATUS_DIR:-}" ]; then
			mkdir -p "$DEBS_STATUS_DIR"
			dpkg-deb -f "$deb" >"$DEBS_STATUS_DIR/$(dpkg-deb -f "$deb" Package)"
		fi
	done
}

# debs_merge_usr ROOT gives ROOT bookworm's merged-/usr layout: /bin, /sbin,
# /lib and /lib64 are links into usr/. Bookworm's packages still ship files
# under /lib (libc6's loader, and its absolute /lib64/ld-linux-x86-64.so.2
# link), and dpkg -x replaces a /lib link with a directory, so the merge is
# done after unpacking: both paths then reach the same file, as on a host.
debs_merge_usr() {
	local root=$1 d
	for d in bin sbin lib lib64; do
		mkdir -p "$root/usr/$d"
		if [ -d "$root/$d" ] && [ ! -L "$root/$d" ]; then
			cp -a "$root/$d/." "$root/usr/$d/"
			rm -rf "${root:?}/$d"
		fi
		ln -sfn "usr/$d" "$root/$d"
	done
}
