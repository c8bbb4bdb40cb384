//! `--join`: a fresh node asks a member to add it (learner, catch-up, voter).

use std::time::Duration;

use tokio::sync::watch;

const RETRY: Duration = Duration::from_secs(1);

pub async fn join_cluster(
    seed: String,
    id: u64,
    peer_addr: String,
    client_addr: String,
    own_client: rdkv_client::ClientOptions,
    mut shutdown: watch::Receiver<bool>,
) {
    loop {
        let attempt = async {
            let options = rdkv_client::ClientOptions {
                // Adding a member waits for it to catch up, snapshot included.
                request_timeout: Duration::from_secs(120),
                ..own_client.clone()
            };
            let client = rdkv_client::Client::connect_with(&[seed.as_str()], options).await?;
            client
                .add_member(id, peer_addr.clone(), client_addr.clone(), false)
                .await
        };
        tokio::select! {
            result = attempt => match result {
                Ok(_) => {
                    tracing::info!(%seed, "joined the cluster");
                    return;
                }
                Err(e) => tracing::warn!(%seed, "joining the cluster: {e}; retrying"),
            },
            _ = shutdown.changed() => return,
        }
        tokio::select! {
            _ = tokio::time::sleep(RETRY) => {}
            _ = shutdown.changed() => return,
        }
    }
}
