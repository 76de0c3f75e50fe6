#!/usr/bin/env bash
# Unpack Jane Austen's novels (Debian package r-cran-janeaustenr, public-domain text) into ./.corpus,
# without installing R: the evaluation corpus of docs/QUALITY.md.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .corpus
tmp=$(mktemp -d)
(cd "$tmp" && apt-get download r-cran-janeaustenr >/dev/null)
dpkg -x "$tmp"/r-cran-janeaustenr_*.deb .corpus
rm -rf "$tmp"
echo "fetch_corpus: Jane Austen's novels are in .corpus/usr/lib/R/site-library/janeaustenr/data"
