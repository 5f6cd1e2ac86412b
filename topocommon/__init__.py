"""What the launcher, the proxy (server/) and loadgen share, so that none imports another's
insides: hub access (hub), NVML calls and live GPU samples (nvml), and the API key file
(keyfile). Depends on no other toposerve package."""
