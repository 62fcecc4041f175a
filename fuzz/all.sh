#!/bin/sh
# `make fuzz`: each target coverage-guided (atheris) for FUZZ_SECONDS, then the C region decoder's
# AddressSanitizer build on the corpus atheris grew, for FUZZ_SECONDS more. Logs in build/fuzz-logs/;
# inputs that broke an oracle in build/fuzz-artifacts/TARGET/. Exit 1 when any target found something.
set -u
PY=${PYTHON:-.venv/bin/python}
SECONDS_EACH=${FUZZ_SECONDS:-60}
ALL=$($PY -c "from fuzz.targets import TARGETS; print(' '.join(TARGETS))")  # every target in targets.py
TARGETS=${FUZZ_TARGETS:-$ALL}
mkdir -p build/fuzz-logs
status=0
summary=""
for t in $TARGETS; do
    log=build/fuzz-logs/$t.log
    echo "== fuzz $t for ${SECONDS_EACH}s (log: $log)"
    $PY -m fuzz.run "$t" -max_total_time="$SECONDS_EACH" ${FUZZ_FLAGS:-} > "$log" 2>&1
    runs=$(grep -o '^Done [0-9]* runs' "$log" | tail -1)
    cov=$(grep -Eo 'cov: [0-9]+ ft: [0-9]+' "$log" | tail -1)
    found=$(grep -c '^=== FINDING' "$log")
    grep -qE '^Done|^=== FINDING' "$log" || { found="crash"; tail -30 "$log"; }
    summary="$summary\n$t: ${runs:-no runs} (${cov:-no coverage line}), findings: $found"
    [ "$found" = 0 ] || status=1
    if [ "$t" = jpeg_region ]; then
        log=build/fuzz-logs/jpeg_region_asan.log
        echo "== fuzz jpeg_region (AddressSanitizer build, mutation) for ${SECONDS_EACH}s (log: $log)"
        $PY -m fuzz.run --mutate jpeg_region "$SECONDS_EACH" > "$log" 2>&1
        runs=$(grep -o '^Done [0-9]* runs' "$log" | tail -1)
        found=$(grep -c '^=== FINDING' "$log")
        grep -qE 'ERROR: AddressSanitizer|runtime error:' "$log" && found="$found + sanitizer report"
        grep -q '^Done' "$log" || { found="crash"; tail -30 "$log"; }
        summary="$summary\njpeg_region (ASan): ${runs:-no runs}, findings: $found"
        [ "$found" = 0 ] || status=1
    fi
done
rm -rf build/fuzz-tmp
printf "$summary\n"
for t in $TARGETS; do grep -h '^=== FINDING' build/fuzz-logs/$t*.log; done 2>/dev/null | sort -u
exit $status
