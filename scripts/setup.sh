#!/bin/sh
# SPDX-License-Identifier: BSD-2-Clause OR GPL-2.0-only
# Install what fabep needs (Debian/Ubuntu), then configure and build it in
# the source tree.  Safe to run again: installs only what is missing and
# rebuilds only what changed.  Extra arguments go to ./configure, which
# then runs again on a tree already configured.
set -eu
cd "$(dirname "$0")/.."

pkgs="build-essential autoconf automake libtool pkg-config libfabric-dev
libfabric-bin librdmacm-dev libibverbs-dev libnuma-dev check
python3 python3-numpy python3-torch python3-pytest openmpi-bin libopenmpi-dev"
missing=""
for p in $pkgs; do
	dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" ||
		missing="$missing $p"
done
if [ -n "$missing" ]; then
	if ! command -v apt-get >/dev/null 2>&1; then
		echo "setup.sh: please install:$missing" >&2
		exit 1
	fi
	sudo=""
	[ "$(id -u)" -eq 0 ] || sudo="sudo"
	echo "setup.sh: installing$missing"
	$sudo env DEBIAN_FRONTEND=noninteractive apt-get update -q
	$sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -q \
		--no-install-recommends $missing
fi
[ -x configure ] || autoreconf -fi
# configure again where asked for something (arguments)
if [ ! -f Makefile ] || [ $# -gt 0 ]; then
	./configure "$@"
fi
make -j"$(nproc)"
