//! What the randomized integration tests share.

/// The seed of a randomized test: `LASTPAGE_SEED` if set, else a fresh one. Printed, so that a
/// failing run can be repeated.
pub fn seed() -> u64 {
    let seed = std::env::var("LASTPAGE_SEED")
        .ok()
        .and_then(|text| text.parse().ok())
        .unwrap_or_else(rand::random);
    println!("seed = {seed} (rerun with LASTPAGE_SEED={seed})");
    seed
}
