//! Test harness: starts real rdkv-server processes.
