#!/bin/sh
# SPDX-License-Identifier: BSD-2-Clause OR GPL-2.0-only
# docs.sh - the documentation says what the code does, where a script can
# tell:
#  - each tool's long options in --help are the ones in the OPTIONS section
#    of its man page, and the other way round;
#  - configure's version is the header's FABEP_VERSION_*, the library's
#    (the tools' --version) and the one in every man page's title line;
#  - every call in fabep.h has an installed man page;
#  - every FABEP_* variable the library reads is in fabep(7);
#  - the shared library exports exactly the calls of fabep.h, each with
#    a FABEP_x.y symbol version;
#  - fabep.h compiles alone, pedantic, as C89, C99, C11 and (where there is
#    a C++ compiler) C++98, C++11 and C++17.
# Runs from the build directory (srcdir: the source tree).
top_builddir=${top_builddir:-.}
srcdir=${srcdir:-.}
fails=0

fail() {
	echo "FAIL: $*"
	fails=$((fails + 1))
}

# Long options of a roff OPTIONS section: "\-\-name" -> "--name".
man_opts() {
	sed -n '/^\.SH OPTIONS/,/^\.SH /p' "$1" |
		grep -oE '\\-\\-[a-z]([a-z]|\\-)*' | sed 's/\\-/-/g' | sort -u
}

# Long options of a tool's --help: the option column only.
help_opts() {
	"$1" --help | grep -E '^ +(-[A-Za-z], )?--' |
		grep -oE '^ +(-[A-Za-z], )?--[a-z-]+' | grep -oE -- '--[a-z-]+' |
		sort -u
}

for t in fabep_info fabep_pingpong fabep_bench fabep_demo fabep_mpi_bench; do
	exe=$top_builddir/utils/$t
	page=$srcdir/man/$t.1
	if [ ! -x "$exe" ]; then
		# the MPI baseline is built only where configure found MPI
		[ $t = fabep_mpi_bench ] && continue
		fail "$exe not built"
		continue
	fi
	h=$(help_opts "$exe")
	m=$(man_opts "$page")
	[ -n "$h" ] || fail "$t --help lists no long option"
	[ -n "$m" ] || fail "$page has no OPTIONS section with long options"
	for o in $h; do
		echo "$m" | grep -qx -- "$o" ||
			fail "$t --help has $o, $page does not"
	done
	for o in $m; do
		echo "$h" | grep -qx -- "$o" ||
			fail "$page has $o, $t --help does not"
	done
done

# --- versions ---
hdr=$srcdir/include/fabep.h
hv=$(for p in MAJOR MINOR PATCH; do
	sed -n "s/^#define FABEP_VERSION_$p \([0-9]*\)$/\1/p" "$hdr"
done | paste -sd. -)
lv=$("$top_builddir/utils/fabep_info" --version | sed -n 's/^libfabep: //p')
tv=$("$top_builddir/utils/fabep_info" --version | sed -n 's/^fabep_info: //p')
pv=${PACKAGE_VERSION:-$tv}
[ -n "$pv" ] || fail "no version from configure or fabep_info --version"
[ "$hv" = "$pv" ] ||
	fail "fabep.h says FABEP_VERSION_* = $hv, configure says $pv"
[ "$lv" = "$pv" ] || fail "the library says $lv (fabep_version), configure $pv"
[ "$tv" = "$pv" ] || fail "fabep_info --version says $tv, configure $pv"
if [ -x "$top_builddir/utils/fabep_mpi_bench" ]; then
	mv=$("$top_builddir/utils/fabep_mpi_bench" --version |
		sed -n 's/^fabep_mpi_bench: //p')
	[ "$mv" = "$pv" ] || fail "fabep_mpi_bench --version says $mv, configure $pv"
fi
npages=0
for page in "$srcdir"/man/*.[137]; do
	head -3 "$page" | grep -q '^\.so ' && continue
	npages=$((npages + 1))
	th=$(grep -m1 '^\.TH ' "$page")
	case $th in
	*"\"fabep $pv\" \"fabep\"") ;;
	*) fail "${page##*/}: title line '$th' does not say \"fabep $pv\" \"fabep\"" ;;
	esac
done
[ $npages -gt 10 ] || fail "only $npages man pages with a title line"

# --- every call has its page, and the page is installed ---
calls=$(grep -oE '^FABEP_API [^(]*[ *]fabep_[a-z0-9_]+\(' "$hdr" |
	grep -oE 'fabep_[a-z0-9_]+\($' | tr -d '(' | sort -u)
[ "$(echo "$calls" | wc -l)" -gt 40 ] || fail "found few calls in $hdr: $calls"
for c in $calls; do
	[ -f "$srcdir/man/$c.3" ] || fail "$c has no man page man/$c.3"
	grep -q "man/$c\.3\b" "$srcdir/man/Makefile.include" ||
		fail "man/$c.3 is not installed (man/Makefile.include)"
done

# --- the shared library exports the header's calls, each versioned ---
so=$top_builddir/src/.libs/libfabep.so
if [ -f "$so" ] && command -v objdump >/dev/null 2>&1; then
	exported=$(objdump -T "$so" | awk '$2 == "g" && $NF ~ /^fabep_/ { print $NF }' |
		sort -u)
	for c in $exported; do
		echo "$calls" | grep -qx "$c" || fail "libfabep.so exports $c, fabep.h does not declare it"
	done
	for c in $calls; do
		echo "$exported" | grep -qx "$c" || fail "fabep.h declares $c, libfabep.so does not export it"
	done
	unv=$(objdump -T "$so" | awk '$NF ~ /^fabep_/ && $(NF-1) !~ /^FABEP_[0-9]/ { print $NF }')
	[ -z "$unv" ] || fail "calls without a FABEP_x.y symbol version: $unv"
fi

# --- every variable the library reads is documented ---
vars=$(grep -rhoE '"FABEP_[A-Z0-9_]+"' "$srcdir/src" --include='*.c' \
	--include='*.h' | tr -d '"' | sort -u)
[ -n "$vars" ] || fail "found no FABEP_* variable in $srcdir/src"
for v in $vars; do
	grep -q "$v" "$srcdir/man/fabep.7" || fail "$v is read but not in fabep(7)"
done

# --- the header builds in every dialect a user's program may use ---
# (C89 and C++98 know no comma after an enum's last enumerator)
cc=${CC:-cc}
for std in c89 c99 c11; do
	out=$(echo '#include <fabep.h>' | $cc -std=$std -Wall -Wextra -pedantic \
		-Werror -I "$srcdir/include" -x c -fsyntax-only - 2>&1) ||
		fail "fabep.h as $std: $out"
done
if command -v c++ >/dev/null 2>&1; then
	for std in c++98 c++11 c++17; do
		out=$(echo '#include <fabep.h>' | c++ -std=$std -Wall -Wextra \
			-pedantic -Werror -I "$srcdir/include" -x c++ \
			-fsyntax-only - 2>&1) || fail "fabep.h as $std: $out"
	done
else
	echo "no c++ here: fabep.h not checked as C++"
fi

[ $fails = 0 ] && echo "PASS: options, versions, pages and variables agree"
[ $fails = 0 ]
