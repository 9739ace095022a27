#!/usr/bin/env bash
# Builds the images tests/env_docker.rs runs against, locally (no container registry needed):
#
#   swerve-test-python:1    Debian bookworm (mmdebstrap --variant=minbase from Debian's mirror,
#                           then `docker import`) with python3, pytest, pip, git, procps, pytz,
#                           simplejson (marshmallow's tests import the last two).
#   swerve-test-swebench:1  FROM the above: tests/fixtures/docker/swebench/repo committed in git
#                           at /testbed (mathx.mean floors: a known bug), SWE-bench-shaped.
#   swerve-test-django:1    FROM the above: tests/fixtures/docker/django/repo at /testbed, with a
#                           standard-library stand-in for Django's tests/runtests.py; its package
#                           installed as a copy in site-packages (`pip install .`, as Django
#                           1.4-2.2's `python setup.py install` copies), which the runner imports.
#   swerve-test-marshmallow:1  FROM the above: a real SWE-bench instance's repository, a subset of
#                           marshmallow at the base_commit of marshmallow-code__marshmallow-1359
#                           (tests/fixtures/docker/marshmallow/SOURCE.md), installed editable as
#                           the harness installs it (`pip install -e`, no dependencies needed).
#
# The repository images carry the commit as the label `swerve.base_commit` (also written to
# /swerve/base_commit). The commit is made on the host with fixed names and dates, so its hash
# depends only on the fixture's files: the build checks the image's HEAD against it.
#
# Idempotent: an image whose label `swerve.content` matches the hash of its recipe (and of its
# base image and fixture files) is kept. Environment: DOCKER (default docker; podman works),
# SWERVE_DEBIAN_MIRROR (default http://deb.debian.org/debian), SWERVE_REBUILD=1 rebuilds all.
set -euo pipefail
cd "$(dirname "$0")/.."
DOCKER=${DOCKER:-docker}
MIRROR=${SWERVE_DEBIAN_MIRROR:-http://deb.debian.org/debian}
FIXTURES=tests/fixtures/docker
BASE=swerve-test-python:1
PACKAGES=python3,python3-pytest,python3-pip,git,procps,python3-tz,python3-simplejson
# Changing anything here rebuilds the base image (the mirror is not part of the recipe).
BASE_RECIPE="v1 bookworm minbase $PACKAGES no-docs"
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT

hash() { sha256sum | cut -c1-32; }

label_of() { # IMAGE LABEL: the label's value, empty when the image or the label is absent
  "$DOCKER" image inspect -f "{{index .Config.Labels \"$2\"}}" "$1" 2>/dev/null || true
}

up_to_date() { # IMAGE HASH
  if [ "${SWERVE_REBUILD:-0}" = 1 ]; then return 1; fi
  [ "$(label_of "$1" swerve.content)" = "$2" ]
}

build_base() {
  local content
  content=$(echo "$BASE_RECIPE" | hash)
  if up_to_date "$BASE" "$content"; then
    echo "$BASE is up to date ($content)"
    return
  fi
  local started=$SECONDS
  echo "building $BASE from $MIRROR"
  mmdebstrap --variant=minbase --include="$PACKAGES" \
    --aptopt='Acquire::Retries "3"' \
    --dpkgopt='path-exclude=/usr/share/man/*' \
    --dpkgopt='path-exclude=/usr/share/doc/*' \
    --dpkgopt='path-include=/usr/share/doc/*/copyright' \
    --dpkgopt='path-exclude=/usr/share/locale/*' \
    --customize-hook='rm -rf "$1"/var/lib/apt/lists/* "$1"/var/cache/apt/*' \
    bookworm "$TMP/rootfs.tar" "$MIRROR"
  "$DOCKER" import \
    --change 'WORKDIR /' \
    --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'ENV LANG=C.UTF-8' \
    --change 'CMD ["/bin/bash"]' \
    --change "LABEL swerve.content=$content" \
    "$TMP/rootfs.tar" "$BASE" >/dev/null
  rm -f "$TMP/rootfs.tar"
  echo "built $BASE in $((SECONDS - started)) s"
}

commit_fixture() { # FIXTURE DEST: DEST/repo is the fixture's repo committed in git; prints HEAD
  cp -a "$FIXTURES/$1/repo" "$2/repo"
  (
    cd "$2/repo"
    export GIT_CONFIG_GLOBAL=/dev/null GIT_CONFIG_NOSYSTEM=1
    export GIT_AUTHOR_NAME=swerve GIT_AUTHOR_EMAIL=swerve@example.invalid
    export GIT_COMMITTER_NAME=swerve GIT_COMMITTER_EMAIL=swerve@example.invalid
    export GIT_AUTHOR_DATE='2024-01-01T00:00:00+0000' GIT_COMMITTER_DATE='2024-01-01T00:00:00+0000'
    git init -q -b main .
    git add -A
    git commit -q -m "$1 test repository"
    git rev-parse HEAD
  )
}

build_repo_image() { # FIXTURE IMAGE [INSTALL]: INSTALL run in /testbed, its leftovers removed
  local fixture=$1 image=$2 install=${3:-true} base_id content dir commit
  base_id=$("$DOCKER" image inspect -f '{{.Id}}' "$BASE")
  # The fixture's files (names, modes, contents), this function's recipe and the base image.
  content=$(
    {
      echo "v1 $base_id $install"
      declare -f build_repo_image commit_fixture
      tar --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner -cf - -C "$FIXTURES" "$fixture"
    } | hash
  )
  if up_to_date "$image" "$content"; then
    echo "$image is up to date ($content, base_commit $(label_of "$image" swerve.base_commit))"
    return
  fi
  local started=$SECONDS
  dir="$TMP/$fixture"
  mkdir -p "$dir"
  commit=$(commit_fixture "$fixture" "$dir")
  # The legacy builder: a local FROM with no registry lookup, on any daemon version.
  DOCKER_BUILDKIT=0 "$DOCKER" build -q -t "$image" -f - "$dir" >/dev/null <<EOF
FROM $BASE
COPY repo/ /testbed/
RUN mkdir -p /swerve && echo $commit > /swerve/base_commit \
 && cd /testbed && $install && rm -rf build *.egg-info && git update-index -q --refresh \
 && test "\$(git rev-parse HEAD)" = $commit \
 && test -z "\$(git status --porcelain)"
WORKDIR /testbed
LABEL swerve.content=$content swerve.base_commit=$commit
EOF
  echo "built $image in $((SECONDS - started)) s (base_commit $commit)"
}

command -v "$DOCKER" >/dev/null || { echo "no $DOCKER CLI" >&2; exit 1; }
build_base
build_repo_image swebench swerve-test-swebench:1
build_repo_image marshmallow swerve-test-marshmallow:1 \
  "pip install -q --no-deps --no-index --no-build-isolation --break-system-packages -e ."
build_repo_image django swerve-test-django:1 \
  "pip install -q --no-deps --no-index --no-build-isolation --break-system-packages ."
