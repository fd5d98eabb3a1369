#!/usr/bin/env bash
# `make check`'s tests on each Python the package claims beside the default one: for each
# version given (e.g. 3.12 3.13), find its interpreter, make its own virtualenv
# (.venv-<version>, from the same constraints) and run the quick tier in it.
#
# An interpreter is looked for as python<version> that runs, then in pyenv's versions
# (the machines here carry pyenv with several CPythons). One that cannot be found fails
# the run: a claimed Python that goes untested is a failure, not a skip.
set -euo pipefail
cd "$(dirname "$0")/.."

find_python() {
    local version=$1 candidate
    if candidate=$(command -v "python$version") && "$candidate" -c '' 2>/dev/null; then
        echo "$candidate"
        return
    fi
    local root=${PYENV_ROOT:-$HOME/.pyenv}
    for candidate in "$root"/versions/"$version".*/bin/python"$version"; do
        if [ -x "$candidate" ]; then
            echo "$candidate"
            return
        fi
    done
    return 1
}

for version in "$@"; do
    if ! python=$(find_python "$version"); then
        echo "check-pythons: no Python $version found (python$version, or pyenv's" \
             "versions under ${PYENV_ROOT:-$HOME/.pyenv}); install it, or set" \
             "CHECK_PYTHONS to the versions to test" >&2
        exit 1
    fi
    echo "check-pythons: $("$python" --version) ($python)"
    make --no-print-directory VENV=".venv-$version" PYTHON="$python" venv
    ".venv-$version/bin/python" -m pytest -q -n "${TEST_WORKERS:-2}" -p no:cacheprovider \
        -m "not slow and not real and not interop" ${CHECK_TESTS}
done
