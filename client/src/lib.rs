//! rdkv client library.
