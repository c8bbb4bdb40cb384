//! Talks to a local rdkv node: `cargo run -p rdkv-client --example basic`
//! (start one with `rdkv-server` first; set `RDKV_TOKEN` if it has a token).

use rdkv_client::{Client, ClientOptions};

#[tokio::main]
async fn main() -> Result<(), rdkv_client::Error> {
    let options = ClientOptions {
        token: std::env::var("RDKV_TOKEN").ok(),
        ..ClientOptions::default()
    };
    let client = Client::connect_with(&["127.0.0.1:7379"], options).await?;

    let version = client.put("greeting", "hello").await?;
    println!("put greeting=hello at version {version}");

    if let Some(got) = client.get("greeting").await? {
        println!(
            "get greeting -> {:?} (version {})",
            String::from_utf8_lossy(&got.value),
            got.version
        );
    }

    // Succeeds only if nobody wrote the key since our put.
    let cas = client
        .cas("greeting", Some(version), Some("hello again".into()))
        .await?;
    println!(
        "cas greeting: succeeded={} version={}",
        cas.succeeded, cas.version
    );

    client.put("other", "value").await?;
    let values = client.mget(["greeting", "other", "missing"]).await?;
    for (key, value) in ["greeting", "other", "missing"].iter().zip(&values) {
        match value {
            Some(v) => println!("{key} = {:?}", String::from_utf8_lossy(&v.value)),
            None => println!("{key} is absent"),
        }
    }
    Ok(())
}
