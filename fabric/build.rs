//! Builds the libfabric shim (feature `ofi`): a few C functions over the
//! headers' static inline API, compiled against the system headers
//! (`libfabric-dev`). Nothing links against libfabric: the library is
//! opened at run time.

fn main() {
    println!("cargo:rerun-if-changed=src/ofi/shim.c");
    #[cfg(feature = "ofi")]
    build_shim();
}

#[cfg(feature = "ofi")]
fn build_shim() {
    if !std::path::Path::new("/usr/include/rdma/fabric.h").exists() {
        println!(
            "cargo:warning=rdma/fabric.h not found in /usr/include: the ofi feature needs \
             libfabric-dev (apt-get install -y libfabric-dev)"
        );
    }
    cc::Build::new()
        .file("src/ofi/shim.c")
        .warnings(true)
        .compile("rdkv_ofi_shim");
}
