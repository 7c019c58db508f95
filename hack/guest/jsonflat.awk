# jsonflat.awk: flatten one JSON document into "<path><TAB><value>" lines, one per scalar, for
# the test guest's init (busybox has awk but no JSON tool). Object keys and array indices are
# joined with "." (storage.files.0.path). Strings are printed with \" \\ \/ decoded; other
# escapes (\n, \uXXXX, ...) stay as written so every value fits on one line. Malformed input
# prints "jsonflat: <reason>" to stderr and exits 2.
{ s = s $0 " " }

END {
	n = length(s)
	pos = 1
	parse_value("")
	skip_ws()
	if (pos <= n) fail("trailing data")
}

function fail(why) {
	printf "jsonflat: %s at offset %d\n", why, pos > "/dev/stderr"
	exit 2
}

function skip_ws(   c) {
	while (pos <= n) {
		c = substr(s, pos, 1)
		if (c != " " && c != "\t" && c != "\r" && c != "\n") return
		pos++
	}
}

function join(path, key) { return path == "" ? key : path "." key }

function parse_value(path,   c) {
	skip_ws()
	c = substr(s, pos, 1)
	if (c == "{") parse_object(path)
	else if (c == "[") parse_array(path)
	else if (c == "\"") print path "\t" parse_string()
	else parse_literal(path)
}

function parse_object(path,   key, c) {
	pos++
	skip_ws()
	if (substr(s, pos, 1) == "}") { pos++; return }
	while (1) {
		skip_ws()
		if (substr(s, pos, 1) != "\"") fail("expected a key")
		key = parse_string()
		skip_ws()
		if (substr(s, pos, 1) != ":") fail("expected ':'")
		pos++
		parse_value(join(path, key))
		skip_ws()
		c = substr(s, pos, 1)
		pos++
		if (c == "}") return
		if (c != ",") fail("expected ',' or '}'")
	}
}

function parse_array(path,   i, c) {
	pos++
	skip_ws()
	if (substr(s, pos, 1) == "]") { pos++; return }
	for (i = 0; ; i++) {
		parse_value(join(path, i))
		skip_ws()
		c = substr(s, pos, 1)
		pos++
		if (c == "]") return
		if (c != ",") fail("expected ',' or ']'")
	}
}

# pos is at the opening quote; returns the string, pos after the closing quote
function parse_string(   out, rest, c) {
	pos++
	out = ""
	while (pos <= n) {
		rest = substr(s, pos)
		if (match(rest, /^[^"\\]+/)) {
			out = out substr(rest, 1, RLENGTH)
			pos += RLENGTH
			continue
		}
		c = substr(s, pos, 1)
		if (c == "\"") { pos++; return out }
		# a backslash escape
		c = substr(s, pos + 1, 1)
		if (c == "\"" || c == "\\" || c == "/") out = out c
		else out = out "\\" c
		pos += 2
	}
	fail("unterminated string")
}

function parse_literal(path,   rest) {
	rest = substr(s, pos)
	if (!match(rest, /^(true|false|null|-?[0-9]+(\.[0-9]+)?([eE][-+]?[0-9]+)?)/)) fail("unexpected character")
	print path "\t" substr(rest, 1, RLENGTH)
	pos += RLENGTH
}
