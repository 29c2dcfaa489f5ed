#!/bin/sh
# Download the jars listed in a spark-jars.txt from a Maven repository and check their SHA-256.
#   fetch-jars.sh <list> <dest dir>        (MAVEN_REPO: repository root URL, default Maven Central;
#                                           file:// URLs work, e.g. a local ~/.m2/repository)
# POSIX sh + curl + sha256sum, so it runs in the image's build stage as in the tests.
set -eu
list=$1
dest=$2
repo=${MAVEN_REPO:-https://repo1.maven.org/maven2}
repo=${repo%/}
mkdir -p "$dest"
grep -v '^[[:space:]]*#' "$list" | grep -v '^[[:space:]]*$' | while read -r coord sha256 _; do
  group=${coord%%:*}
  tail=${coord#*:}
  artifact=${tail%%:*}
  version=${tail#*:}
  if [ -z "$group" ] || [ -z "$artifact" ] || [ -z "$version" ] || [ ${#sha256} -ne 64 ]; then
    echo "fetch-jars: bad line in $list: $coord $sha256" >&2
    exit 1
  fi
  file="$artifact-$version.jar"
  url="$repo/$(echo "$group" | tr . /)/$artifact/$version/$file"
  echo "fetch-jars: $url" >&2
  curl --fail --silent --show-error --location --retry 5 --retry-delay 2 -o "$dest/$file.part" "$url"
  echo "$sha256  $dest/$file.part" | sha256sum -c --status - || {
    echo "fetch-jars: SHA-256 mismatch for $file (expected $sha256)" >&2
    rm -f "$dest/$file.part"
    exit 1
  }
  mv "$dest/$file.part" "$dest/$file"
done
count=$(find "$dest" -name '*.jar' | wc -l)
echo "fetch-jars: $count jar(s) in $dest" >&2
