#!/usr/bin/env bash
# Bazel's --workspace_status_command (.bazelrc): the commit the binaries are
# built from, for --version, ServerInfo and the mla_build_info metric.
# "unknown" outside a git checkout (an image built from a copied tree);
# "-dirty" when the tree has changes not yet committed.
commit=$(git rev-parse --short=12 HEAD 2>/dev/null) || commit=unknown
if [[ $commit != unknown ]] && ! git diff --quiet HEAD -- . 2>/dev/null; then
  commit="$commit-dirty"
fi
echo "STABLE_MLA_COMMIT $commit"
