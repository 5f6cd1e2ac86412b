"""What the launcher, the proxy (server/) and loadgen share, so that none imports another's
insides: hub access (hub), NVML calls and live GPU samples (nvml), the API key file
(keyfile), the one HTTP/1.1 client connection (http1) and SSE reader (sse) of the proxy,
loadgen and the benchmark client, and JSON text read with every refusal a ValueError
(jsontext). Depends on no other toposerve package."""
