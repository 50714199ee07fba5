#!/bin/sh
# SPDX-License-Identifier: BSD-2-Clause OR GPL-2.0-only
# make installcheck (and so make distcheck): what a user of the installed
# tree does with it, from the installed files alone.
#   - every tool runs and prints this version (-V);
#   - a program built with `pkg-config --cflags --libs fabep` links,
#     loads the installed library and runs an allreduce on a world of one,
#     checked; with libfabep.a and fabep.pc's Libs.private too, where
#     libfabep.a is installed;
#   - the installed example moe_mpi.c builds with mpicc against the
#     installed library and runs on 2 ranks under mpirun, where configure
#     found MPI;
#   - `import fabep` from the installed package loads the installed
#     library, where the Python package was installed and numpy is there;
#   - every man page is installed.
# The installed tree is read at its prefix (not under DESTDIR).  Set by
# make: BINDIR LIBDIR INCLUDEDIR PYTHONDIR MANDIR EXAMPLEDIR VERSION CC
# PKG_CONFIG MPICC MPIRUN PYTHON PYPKG (yes: the package was installed)
# TOOLS MANS.
set -eu

fail() {
	echo "installcheck: $*" >&2
	exit 1
}
say() {
	echo "installcheck: $*"
}

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT INT TERM
# the installed library, wherever the prefix (/usr/local/lib needs
# ldconfig first)
LD_LIBRARY_PATH=$LIBDIR${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export LD_LIBRARY_PATH
# a world of one, whatever the caller's environment says
unset FABEP_ROOT FABEP_RANK FABEP_WORLD_SIZE OMPI_COMM_WORLD_RANK \
	OMPI_COMM_WORLD_SIZE PMI_RANK PMI_SIZE SLURM_PROCID SLURM_NTASKS || :

for t in $TOOLS; do
	t=$(basename "$t")
	out=$("$BINDIR/$t" -V 2>&1) || fail "$BINDIR/$t -V failed: $out"
	case $out in
	*"$VERSION"*) ;;
	*) fail "$BINDIR/$t -V does not say $VERSION: $out" ;;
	esac
done
say "tools: $(echo $TOOLS | wc -w) run, version $VERSION"

PKG_CONFIG_PATH=$LIBDIR/pkgconfig${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}
export PKG_CONFIG_PATH
"$PKG_CONFIG" --exists fabep || fail "pkg-config finds no fabep in $LIBDIR/pkgconfig"
v=$("$PKG_CONFIG" --modversion fabep)
[ "$v" = "$VERSION" ] || fail "fabep.pc says $v, not $VERSION"

cat > "$tmp/ar.c" <<'EOF'
#include <fabep.h>
#include <stdio.h>
#include <string.h>

int main(int argc, char **argv)
{
	enum { ROWS = 3, COLS = 40 };
	float in[ROWS * COLS], out[ROWS * COLS];
	fabep_comm_t *comm;
	fabep_allreduce_t *ar;
	int i, ret;

	if (argc < 2 || strcmp(fabep_version(), argv[1])) {
		fprintf(stderr, "loaded libfabep %s\n", fabep_version());
		return 1;
	}
	ret = fabep_comm_create(NULL, &comm);
	if (ret) {
		fprintf(stderr, "fabep_comm_create: %s\n", fabep_strerror(ret));
		return 1;
	}
	ret = fabep_allreduce_create(comm, ROWS, COLS, FABEP_AR_F32, &ar);
	for (i = 0; i < ROWS * COLS; i++)
		in[i] = (float)i * 0.5f;
	if (!ret)
		ret = fabep_allreduce(ar, in, out, ROWS, COLS);
	for (i = 0; !ret && i < ROWS * COLS; i++)
		if (out[i] != in[i]) {
			fprintf(stderr, "out[%d] = %g, want %g\n", i,
				(double)out[i], (double)in[i]);
			ret = 1;
		}
	if (ret > 0 || ret < 0)
		fprintf(stderr, "allreduce: %s\n", fabep_strerror(ret));
	fabep_allreduce_destroy(ar);
	if (fabep_comm_destroy(comm))
		ret = 1;
	return ret ? 1 : 0;
}
EOF
# libfabep.a with fabep.pc's Libs.private, and libfabric shared:
# `pkg-config --static` would take libfabric's own Libs.private, which on
# Debian name PSM libraries that libfabric-dev does not bring (-lpsm2,
# -lpsm_infinipath)
priv=$(sed -n 's/^Libs.private: *//p' "$LIBDIR/pkgconfig/fabep.pc")
static_libs="$LIBDIR/libfabep.a $("$PKG_CONFIG" --libs libfabric) $priv"
# the README's line: the shared library where it is installed, else
# (--disable-shared) libfabep.a, whose dependencies fabep.pc then names
# in Libs
libs=$("$PKG_CONFIG" --libs fabep)
# shellcheck disable=SC2046,SC2086 # pkg-config's flags are words
$CC -o "$tmp/ar" "$tmp/ar.c" $("$PKG_CONFIG" --cflags fabep) $libs ||
	fail "a program against fabep.pc ($libs) does not build"
"$tmp/ar" "$VERSION" ||
	fail "a program against the installed library failed"
if [ -e "$LIBDIR/libfabep.so" ]; then
	say "pkg-config: a program built, ran an allreduce on the installed library"
else
	say "pkg-config: a program built on libfabep.a (--disable-shared), ran an allreduce"
fi
if [ -e "$LIBDIR/libfabep.so" ] && [ -f "$LIBDIR/libfabep.a" ]; then
	# shellcheck disable=SC2046,SC2086
	$CC -o "$tmp/ar_static" "$tmp/ar.c" $("$PKG_CONFIG" --cflags fabep) \
		$static_libs ||
		fail "a program against libfabep.a and fabep.pc's Libs.private does not build"
	"$tmp/ar_static" "$VERSION" || fail "the program linked statically to libfabep failed"
	say "libfabep.a: the same, with fabep.pc's Libs.private"
fi

if [ -n "$MPICC" ] && [ -n "$MPIRUN" ] && [ -f "$EXAMPLEDIR/moe_mpi.c" ]; then
	# shellcheck disable=SC2046
	# shellcheck disable=SC2086
	"$MPICC" -o "$tmp/moe_mpi" "$EXAMPLEDIR/moe_mpi.c" \
		$("$PKG_CONFIG" --cflags fabep) $libs -lm ||
		fail "the installed example moe_mpi.c does not build with $MPICC"
	root=
	[ "$(id -u)" -eq 0 ] && root=--allow-run-as-root
	out=$(FABEP_PROVIDER=shm "$MPIRUN" $root --oversubscribe \
		--bind-to none -n 2 "$tmp/moe_mpi" 2>&1) ||
		fail "the installed example on 2 ranks failed: $out"
	case $out in
	*"result: correct"*) ;;
	*) fail "the installed example on 2 ranks says: $out" ;;
	esac
	say "examples: moe_mpi.c built with $MPICC, ran on 2 ranks"
else
	say "examples: no MPI here, moe_mpi.c not built"
fi

if [ "$PYPKG" = yes ]; then
	if "$PYTHON" -c 'import numpy' 2>/dev/null; then
		out=$(cd "$tmp" && PYTHONPATH=$PYTHONDIR "$PYTHON" -c '
import sys, fabep
assert fabep.__file__.startswith(sys.argv[1]), fabep.__file__
assert fabep.version() == sys.argv[2], fabep.version()
with fabep.Comm() as comm:
    assert comm.size == 1
print(fabep.version())' "$PYTHONDIR" "$VERSION" 2>&1) ||
			fail "import fabep from $PYTHONDIR: $out"
		say "python: fabep $out imported from $PYTHONDIR, a communicator made"
	else
		say "python: $PYTHON has no numpy, the package not imported"
	fi
fi

n=0
for m in $MANS; do
	p=$(basename "$m")
	s=${p##*.}
	[ -s "$MANDIR/man$s/$p" ] || fail "$MANDIR/man$s/$p is not installed"
	n=$((n + 1))
done
say "man pages: $n installed"
