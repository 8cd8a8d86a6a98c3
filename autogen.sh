#!/bin/sh
# Generate ./configure and Makefile.in (needs autoconf, automake, libtool
# and pkg-config). Then: ./configure && make && make check
set -e
cd "$(dirname "$0")"
autoreconf -fi
