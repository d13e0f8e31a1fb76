#!/bin/sh
# Run here, in the repository's root, before a GPU check (deploy/gpu-check/README.md): puts what the device
# machine cannot fetch into two ignored folders that the device tool carries, .whl (cp312 wheels of
# wheels.txt) and .device-kit/tokenizer (SmolLM2's tokenizer files, from the pulled model).
set -eu
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
py=${PYTHON:-.venv/bin/python}
mkdir -p .whl .device-kit/tokenizer
grep -v '^#' deploy/gpu-check/wheels.txt | grep . | xargs "$py" -m pip download -q --no-deps --only-binary=:all: \
    --python-version 3.12 --implementation cp -d .whl \
    --platform manylinux_2_34_x86_64 --platform manylinux_2_31_x86_64 --platform manylinux_2_28_x86_64 \
    --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 --platform manylinux_2_5_x86_64 --platform manylinux1_x86_64
model=$("$py" -c 'from homeai.repository.entries import get_entry; from homeai.repository.pull import pull; print(pull(get_entry("smollm2-135m-instruct"), progress=False))')
for f in tokenizer.json tokenizer_config.json special_tokens_map.json generation_config.json; do
    [ -f "$model/$f" ] && cp "$model/$f" .device-kit/tokenizer/
done
du -sh .whl .device-kit
