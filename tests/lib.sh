# SPDX-License-Identifier: BSD-2-Clause OR GPL-2.0-only
# lib.sh - shell functions of the tests that run the tools (sourced by
# tools.sh and netns.sh; not a test of its own).

# wait_for FILE PATTERN SECONDS [PID]: wait up to SECONDS for a line
# matching PATTERN in FILE, while process PID (when given) lives.  A case
# that acts on a process at a stage of its run waits for that stage:
# slow starts, as under a sanitizer beside other tests, make a fixed
# sleep too short.  Status 0 when the line came.  FILE must hold no
# earlier run's lines (empty it before the launch): a job started with &
# truncates it only once its shell reaches the redirection, which may be
# after the first look here.
wait_for() {
	_wf_n=0
	while [ $_wf_n -lt $(($3 * 10)) ]; do
		grep -q "$2" "$1" 2>/dev/null && return 0
		[ -z "$4" ] || kill -0 "$4" 2>/dev/null || break
		sleep 0.1
		_wf_n=$((_wf_n + 1))
	done
	grep -q "$2" "$1" 2>/dev/null
}

# serve CMD...: CMD in the background, its stdout in $tmp.srv and its
# stderr in $tmp.srv.err, both emptied first (wait_for must see none of
# an earlier server's lines), its pid in $srv.
serve() {
	: >"$tmp.srv"
	: >"$tmp.srv.err"
	"$@" >"$tmp.srv" 2>"$tmp.srv.err" &
	srv=$!
}
