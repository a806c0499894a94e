# Sourced by the install scripts: fetches one pinned Debian package and unpacks it, without
# installing it on the system (the .deb is downloaded and extracted, never configured, so no
# service starts and nothing outside tools/ changes).
#
#   unpack_pinned_deb PACKAGE VERSION
#
# leaves the package's files under "$work/root" ($work is removed when the script exits),
# or exits 1 saying why (no apt, or apt offers another version than the pin).
unpack_pinned_deb() {
  local package=$1 version=$2 candidate
  if ! command -v apt-get >/dev/null; then
    echo "$(basename "$0") needs apt-get (a Debian or Ubuntu host) to fetch $package $version" >&2
    exit 1
  fi
  candidate=$(apt-cache policy "$package" 2>/dev/null | awk '/Candidate:/ {print $2}')
  if [ "$candidate" != "$version" ] && [ "$(id -u)" = 0 ]; then
    # A fresh machine may have no package lists yet.
    apt-get update -q >/dev/null 2>&1 || true
    candidate=$(apt-cache policy "$package" 2>/dev/null | awk '/Candidate:/ {print $2}')
  fi
  if [ "$candidate" != "$version" ]; then
    echo "apt offers $package ${candidate:-none}, not the pinned $version;" \
      "run apt-get update, or change the pin after checking the new version" >&2
    exit 1
  fi
  work=$(mktemp -d)
  chmod 755 "$work"   # apt downloads as its own user
  trap 'rm -rf "$work"' EXIT
  (cd "$work" && apt-get download -q "$package=$version" >/dev/null)
  dpkg-deb -x "$work/${package}"_*.deb "$work/root"
}
