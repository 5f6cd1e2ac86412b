"""What a run leaves behind, apart from the loop that measures it (loadgen.api).

    results   the typed values a run hands over: Report, LevelResult, Warmup
    report    those as data (JSON, CSV) and as rich tables and notes
    export    loadgen_* series for Prometheus (Pushgateway, a metrics port)
    plot      a sweep drawn to PNG
    compare   two --json files side by side

Nothing here sends a request or imports the orchestrator; the orchestrator imports `results`.
"""
