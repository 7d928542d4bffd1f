"""The Streamlit explorer: runs, one timeline of telemetry and traces, summaries and analyses,
run comparison and read-only SQL. It talks only to the Query service, over gRPC."""
