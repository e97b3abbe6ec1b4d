#!/usr/bin/env bash
# Checks the dependency rule of src/ (README "Layout") at every level:
#  - between layers (the top-level modules): every import must be one the
#    table below allows;
#  - inside every folder: the files (and sub-folders) of one folder must not
#    import each other in a circle, `mod.rs` included (a parent that imports
#    a child which imports the parent back is a circle too);
#  - no `use super::*` outside a test module: a glob from the parent brings
#    in whatever the parent imported, so the imports a file really makes
#    (and the layers it reaches) cannot be seen.
# An import is any path a file names that leads into the crate (`crate::`,
# `super::`, `self::`, a child module, `filedock::` in the binary), in `use`
# trees or inline; comments, strings and `#[cfg(test)]` modules are left
# out (a file declared `#[cfg(test)] mod x;` too). A path is an edge to the
# file that defines the module it names (an item re-exported by a `mod.rs`
# is an edge to that `mod.rs`).
# `bash scripts/layers.sh -v` prints the file edges.
set -euo pipefail
cd "$(dirname "$0")/.."

# layer: the layers it may import. Everything may use its own layer, and
# every layer may use the vocabulary (`vocab`: ids, commands, keys).
declare -A ALLOWED=(
  [vocab]=""
  [root]=""
  [config]=""
  [metrics]=""
  [telemetry]=""
  [client]=""
  [worker]=""
  [hooks]="config metrics"
  [blob]="config metrics"
  [lock]="config metrics redis_link"
  [meta]="config metrics root"
  [redis_link]="config"
  [coord]="lock meta metrics config worker redis_link"
  [ports]="blob lock meta metrics"
  [domain]="blob coord lock meta metrics config root worker hooks"
  [http]="domain blob coord meta metrics config ports"
  [startup]="http domain blob coord lock meta metrics config ports worker redis_link hooks"
  [testing]=""
  [main]="client startup http domain config ports telemetry"
)

layer_of_file() {
  case "$1" in
    src/lib.rs) echo root ;;
    src/*/*) local rest=${1#src/}; echo "${rest%%/*}" ;;
    src/*.rs) local base=${1#src/}; echo "${base%.rs}" ;;
  esac
}

# Prints one line per import, "FROM TO" (both files), and "GLOB FILE" for a
# `use super::*` outside a test module.
file_edges() {
  perl -e '
use strict; use warnings;
my @files = @ARGV;
# The module path of every file, per crate ("lib" or "bin": main.rs and client/).
my (%mod_of, %file_of);
sub crate_of { my $f = shift; return ($f eq "src/main.rs" || $f =~ m{^src/client/}) ? "bin" : "lib" }
for my $f (@files) {
  my $p = $f; $p =~ s{^src/}{}; $p =~ s{\.rs$}{};
  $p =~ s{(^|/)(mod|lib|main)$}{};
  $p =~ s{/}{::}g;
  $mod_of{$f} = $p; $file_of{crate_of($f)}{$p} = $f;
}
# `#[path = "x.rs"] mod name;`: x.rs is module `name` of the file declaring it.
for my $f (@files) {
  open my $fh, "<", $f or die "$f: $!"; local $/; my $src = <$fh>; close $fh;
  while ($src =~ /#\[path\s*=\s*"([^"]+)"\]\s*(?:pub(?:\([^)]*\))?\s+)?mod\s+(\w+)\s*;/g) {
    my ($dir) = $f =~ m{^(.*)/}; my $target = "$dir/$1";
    next unless exists $mod_of{$target};
    delete $file_of{crate_of($target)}{$mod_of{$target}};
    $mod_of{$target} = join "::", grep { length } ($mod_of{$f}, $2);
    $file_of{crate_of($target)}{$mod_of{$target}} = $target;
  }
}
# `#[cfg(test)] mod name;`: the file of `name` is test code, left out (as
# inline test modules are).
my %test_only;
for my $f (@files) {
  open my $fh, "<", $f or die "$f: $!"; local $/; my $src = <$fh>; close $fh;
  while ($src =~ /#\[cfg\(test\)\]\s*(?:pub(?:\([^)]*\))?\s+)?mod\s+(\w+)\s*;/g) {
    my $child = join "::", grep { length } ($mod_of{$f}, $1);
    my $target = $file_of{crate_of($f)}{$child};
    $test_only{$target} = 1 if defined $target;
  }
}
# Code without comments, strings and character literals.
sub strip {
  my $s = shift; my $out = ""; my $i = 0; my $n = length $s;
  while ($i < $n) {
    my $c = substr($s, $i, 1); my $two = substr($s, $i, 2);
    if ($two eq "//") { my $e = index($s, "\n", $i); $e = $n if $e < 0; $i = $e; next }
    if ($two eq "/*") {
      my $depth = 0;
      while ($i < $n) {
        my $t = substr($s, $i, 2);
        if ($t eq "/*") { $depth++; $i += 2 } elsif ($t eq "*/") { $depth--; $i += 2; last if !$depth }
        else { $out .= "\n" if substr($s, $i, 1) eq "\n"; $i++ }
      }
      next;
    }
    if ($c eq "r" && substr($s, $i) =~ /^r(#*)"/ && ($i == 0 || substr($s, $i - 1, 1) !~ /\w/)) {
      my $hashes = $1; my $end = index($s, "\"$hashes", $i + 2 + length $hashes);
      $end = $n if $end < 0; my $body = substr($s, $i, $end - $i);
      $out .= "\"\"" . ("\n" x ($body =~ tr/\n//)); $i = $end + 1 + length $hashes; next;
    }
    if ($c eq "\"") {
      my $j = $i + 1; my $nl = 0;
      while ($j < $n) { my $d = substr($s, $j, 1); if ($d eq "\\") { $j += 2; next } last if $d eq "\""; $nl++ if $d eq "\n"; $j++ }
      $out .= "\"\"" . ("\n" x $nl); $i = $j + 1; next;
    }
    if ($c eq "\x27") {
      if (substr($s, $i) =~ /^\x27(\\(?:u\{[0-9a-fA-F]+\}|x[0-9a-fA-F]{2}|.)|[^\\\x27\n])\x27/) { $out .= "\x27\x27"; $i += length $&; next }
    }
    $out .= $c; $i++;
  }
  return $out;
}
# A `use` tree (its text, without `use` and `;`) as flat paths.
sub flatten {
  my ($tree) = @_; my @out; my @stack = (""); my $cur = "";
  my @tok = $tree =~ /(\w+|::|\{|\}|,|\*)/g;
  for (my $k = 0; $k < @tok; $k++) {
    my $t = $tok[$k];
    if ($t eq "{") { push @stack, $cur; next }
    if ($t eq "," || $t eq "}") {
      push @out, $cur if length $cur && $cur ne $stack[-1];
      pop @stack if $t eq "}";
      $cur = $stack[-1];
      next;
    }
    if ($t eq "as") { $k++; next }
    if ($t eq "::") { $cur .= "::"; next }
    if ($t eq "self" && $cur =~ /::$/) { $cur =~ s/::$//; next }
    $cur .= $t;
  }
  push @out, $cur if length $cur && $cur ne $stack[-1];
  return map { s/::$//r } @out;
}
sub resolve {
  my ($crate, $here, $children, @seg) = @_;
  my @base;
  if ($seg[0] eq "crate") { shift @seg }
  elsif ($seg[0] eq "filedock" && $crate eq "bin") { shift @seg; $crate = "lib" }
  elsif ($seg[0] eq "super" || $seg[0] eq "self") {
    @base = grep { length } split /::/, $here;
    while (@seg && ($seg[0] eq "super" || $seg[0] eq "self")) { pop @base if shift(@seg) eq "super" }
  }
  elsif ($children->{$seg[0]}) { @base = grep { length } split /::/, $here }
  else { return undef }
  my @abs = (@base, @seg);
  for (my $k = @abs; $k >= 0; $k--) {
    my $p = join "::", @abs[0 .. $k - 1];
    return $file_of{$crate}{$p} if exists $file_of{$crate}{$p};
  }
  return undef;
}
for my $f (@files) {
  next if $test_only{$f};
  open my $fh, "<", $f or die "$f: $!"; local $/; my $src = strip(scalar <$fh>); close $fh;
  my $crate = crate_of($f);
  my %children = map { $_ => 1 } $src =~ /^\s*(?:pub(?:\([^)]*\))?\s+)?mod\s+(\w+)\s*;/mg;
  my @tok = $src =~ /(#\s*\[[^\]]*\]|\w+|::|\{|\}|;|\*|,|[^\s\w])/g;
  my @inline;   # open inline modules: [name, depth at which they close]
  my ($depth, %seen) = (0);
  my $emit = sub {
    my ($here, @seg) = @_;
    return unless @seg;
    if ($seg[-1] eq "*" && grep({ $_ eq "super" } @seg)) { print "GLOB $f\n" }
    @seg = grep { $_ ne "*" } @seg;
    my $to = resolve($crate, $here, \%children, @seg);
    print "$f $to\n" if defined $to && $to ne $f && !$test_only{$to} && !$seen{$to}++;
  };
  my $attr_test = 0;
  for (my $k = 0; $k < @tok; $k++) {
    my $t = $tok[$k];
    if ($t =~ /^#\s*\[\s*cfg\s*\(\s*test\s*\)\s*\]$/) { $attr_test = 1; next }
    if ($t =~ /^#/) { next }
    my $here = join "::", grep { length } $mod_of{$f}, map { $_->[0] } @inline;
    if ($t eq "mod" && $k + 2 < @tok && $tok[$k + 1] =~ /^\w+$/ && $tok[$k + 2] eq "{") {
      if ($attr_test) {   # skip the whole test module
        my $d = 0; $k += 2;
        for (; $k < @tok; $k++) { $d++ if $tok[$k] eq "{"; $d-- if $tok[$k] eq "}"; last if !$d }
        $attr_test = 0; next;
      }
      push @inline, [$tok[$k + 1], $depth + 1]; $depth++; $k += 2; $attr_test = 0; next;
    }
    $attr_test = 0 if $t !~ /^(pub|crate|mod|\(|\))$/;
    if ($t eq "{") { $depth++; next }
    if ($t eq "}") { pop @inline if @inline && $inline[-1][1] == $depth; $depth--; next }
    if ($t eq "use") {
      my $tree = ""; $k++;
      for (; $k < @tok && $tok[$k] ne ";"; $k++) { $tree .= " $tok[$k]" }
      for my $p (flatten($tree)) { $emit->($here, split /::/, $p) }
      next;
    }
    if ($t =~ /^\w+$/ && $k + 1 < @tok && $tok[$k + 1] eq "::" && ($k == 0 || $tok[$k - 1] ne "::")) {
      my @seg = ($t); my $j = $k + 1;
      while ($j + 1 < @tok && $tok[$j] eq "::" && $tok[$j + 1] =~ /^(\w+|\*)$/) { push @seg, $tok[$j + 1]; $j += 2 }
      $emit->($here, @seg) if $seg[0] =~ /^(crate|super|self|filedock)$/ || $children{$seg[0]};
      $k = $j - 1; next;
    }
  }
}
' "$@"
}

verbose=${1:-}
fail=0
files=$(find src -name '*.rs' | sort)
raw=$(mktemp)
trap 'rm -f "$raw" "$raw".*' EXIT
# shellcheck disable=SC2086
file_edges $files >"$raw"
grep '^GLOB ' "$raw" | while read -r _ file; do
  echo "layers: $file has \`use super::*\`: name what it imports (a glob hides which layers it reaches)" >&2
  echo x
done | grep -q x && fail=1 || true
grep -v '^GLOB ' "$raw" >"$raw.edges" || true
[[ $verbose == -v ]] && cat "$raw.edges"

# Between layers: the table.
: >"$raw.layers"
while read -r from_file to_file; do
  from=$(layer_of_file "$from_file") to=$(layer_of_file "$to_file")
  [[ -z $from || -z $to || $from == "$to" || $to == vocab ]] && continue
  echo "$from $to" >>"$raw.layers"
  if [[ -z ${ALLOWED[$from]+x} ]]; then
    echo "layers: $from_file is in layer '$from', which the table in scripts/layers.sh does not list" >&2
    fail=1
  elif [[ " ${ALLOWED[$from]} " != *" $to "* ]]; then
    echo "layers: $from_file ($from) imports $to_file ($to): $from may import only: ${ALLOWED[$from]:-nothing} (and vocab)" >&2
    fail=1
  fi
done <"$raw.edges"

# Inside every folder, src/ included: no circle between its entries.
circles=0
for dir in $(find src -type d | sort); do
  awk -v d="$dir/" '
    function unit(f) { r = substr(f, length(d) + 1); sub(/\/.*/, "/", r); return r }
    index($1, d) == 1 && index($2, d) == 1 { a = unit($1); b = unit($2); if (a != b) print a, b }
  ' "$raw.edges" | sort -u >"$raw.dir"
  [[ -s $raw.dir ]] || continue
  if ! tsort "$raw.dir" >/dev/null 2>&1; then
    echo "layers: import circle inside $dir/:" >&2
    # tsort names each loop it breaks; the first is enough to start from.
    tsort "$raw.dir" 2>&1 >/dev/null | awk '/loop:/ && n++ { exit } !/loop:/ { sub(/^tsort: /, ""); print "  " $0 }' >&2 || true
    circles=$((circles + 1))
    fail=1
  fi
done

if ((fail)); then
  exit 1
fi
echo "layers: $(sort -u "$raw.layers" | wc -l) edges between layers, all allowed; $(wc -l <"$raw.edges") imports between files, no circle in any folder; no \`use super::*\`"
