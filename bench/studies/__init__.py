"""One-off studies: each answered one question once (its conclusion is in bench/RESULTS.md), kept runnable as
`python -m bench.studies.NAME`; not type-checked or tested, unlike the maintained tools in bench/."""
