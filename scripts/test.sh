#!/usr/bin/env bash
# The test suite: every crate's unit, integration and doc tests, then the loom model checks of
# the latches, flow control, the default insert path, the log writer, the page memory, the
# row lock manager, the rows deleted by open transactions, the count of ended writes, the
# identity reservations and a table's uniquifiers (in their own target directory, because `--cfg loom` rebuilds every
# dependency).
set -euo pipefail
cd "$(dirname "$0")/.."

cargo test --workspace --all-targets
cargo test --workspace --doc

RUSTFLAGS="--cfg loom" CARGO_TARGET_DIR="${LOOM_TARGET_DIR:-target-loom}" \
    cargo test -p lastpage-storage --release --test latch_loom --test btree_loom --test wal_loom --test page_memory_loom
RUSTFLAGS="--cfg loom" CARGO_TARGET_DIR="${LOOM_TARGET_DIR:-target-loom}" \
    cargo test -p lastpage-engine --release --test locks_loom --test pending_loom --test ended_writes_loom --test identity_loom --test uniquifier_loom
