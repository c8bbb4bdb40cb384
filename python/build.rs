//! The crate's own test binary embeds Python (without the
//! `extension-module` feature it links libpython): point its run-time
//! search path at the interpreter's library directory, so `cargo test
//! --workspace` runs where libpython is not in the system's library path
//! (a pyenv or venv Python). The wheel maturin builds links no libpython,
//! and gets no such path.
fn main() {
    pyo3_build_config::add_libpython_rpath_link_args();
}
