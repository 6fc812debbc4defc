# The code blocks of README.md's "Use Letterbox as SQS", sourced by
# tests/sqs/run.sh and tests/sqs/js.sh, which run each block as printed
# against a fresh server (only the endpoint's port differs: the blocks say
# 127.0.0.1:9324, the server's default, which another process may hold)
# and compare what it prints with the `text` block that follows it.

# readme_block LANG: the first fenced block of language LANG of the
# section.
readme_block() {
  awk -v lang="$1" '
    /^## / { in_section = ($0 == "## Use Letterbox as SQS") }
    !in_section { next }
    inside && /^```$/ { exit }
    inside { print }
    !done && $0 == "```" lang { inside = 1; done = 1 }
  ' README.md
}

# readme_output LANG: the `text` block right after that block.
readme_output() {
  awk -v lang="$1" '
    /^## / { in_section = ($0 == "## Use Letterbox as SQS") }
    !in_section { next }
    $0 == "```" lang { found = 1; next }
    found && !code_done && /^```$/ { code_done = 1; next }
    code_done && !inside && $0 == "```text" { inside = 1; next }
    inside && /^```$/ { exit }
    inside { print }
  ' README.md
}

# readme_check LANG FILE URL RUNNER...: writes the block of LANG to FILE
# with the endpoint URL put in, runs `RUNNER... FILE`, and fails unless it
# prints the README's output.
readme_check() {
  local lang="$1" file="$2" url="$3"
  shift 3
  local code want got
  code="$(readme_block "$lang")"
  [[ -n "$code" ]] || { echo "README.md has no $lang block under Use Letterbox as SQS" >&2; exit 1; }
  want="$(readme_output "$lang")"
  [[ -n "$want" ]] || { echo "README.md shows no output of its $lang block" >&2; exit 1; }
  printf '%s\n' "${code//http:\/\/127.0.0.1:9324/${url%/}}" >"$file"
  got="$("$@" "$file")"
  if [[ "$got" != "$want" ]]; then
    printf 'the README'"'"'s %s block printed:\n%s\ninstead of:\n%s\n' "$lang" "$got" "$want" >&2
    exit 1
  fi
  echo "PASS: the README's $lang block prints what the README shows"
}
