# Sourced by bench/device_wheels.sh and bench/device_quickstart.sh: `device_download DEST SPEC...`
# downloads pure-Python or cp312 manylinux wheels, no dependencies (each caller's list is complete),
# for the device image's Python 3.12 on x86-64.
device_download() {
    local dest=$1; shift
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --abi cp312 --abi abi3 --abi none --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 \
        --platform manylinux_2_27_x86_64 --platform manylinux_2_28_x86_64 --platform any -d "$dest" "$@" 2>&1 \
        | grep -v "is ignored" || true
}
