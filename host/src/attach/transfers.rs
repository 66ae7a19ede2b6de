//! Volume transfers (Cinder's `os-volume-transfer`): a volume's project offers an available
//! volume with a key it gives out of band; a project that presents the key takes the volume
//! over, and the volume is its from then on. While offered, the volume is `awaiting-transfer`:
//! it cannot be attached, deleted or offered again; deleting the offer makes it available to its
//! project again. No driver is involved: the volume's data, backend and node stay as they are.
//! The key is kept as a salted sha256; an acceptance is recorded in the volume's history.

use sha2::{Digest, Sha256};

use super::history::Change;
use super::list::Scope;
use super::state::{Event, transition};
use super::volumes::bounds;
use super::{AttachError, Caller, Service, conclude, names, volume_not_found};
use crate::domain::history::Access;
use crate::domain::quotas;
use crate::store::transfers::{self, Transfer};
use crate::store::volumes;

/// Characters of a transfer's key (Cinder's: upper-case letters and digits).
const KEY_ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
/// Its length (Cinder's `volume_transfer_key_length`): about 82 bits.
const KEY_LENGTH: usize = 16;

/// An offer as made: the transfer, and its key (shown once, never stored).
pub struct Offered {
    pub transfer: Transfer,
    pub auth_key: String,
}

fn transfer_not_found(id: &str) -> AttachError {
    AttachError::NotFound(format!("Transfer {id} could not be found."))
}

fn random_key() -> String {
    let mut key = String::with_capacity(KEY_LENGTH);
    while key.len() < KEY_LENGTH {
        let mut bytes = [0u8; KEY_LENGTH];
        getrandom::fill(&mut bytes).expect("the operating system's random number generator failed");
        // 252 = 7 x 36: a byte below it maps to a character without bias; one past it is dropped.
        for b in bytes.into_iter().filter(|b| *b < 252).take(KEY_LENGTH - key.len()) {
            key.push(char::from(KEY_ALPHABET[usize::from(b) % KEY_ALPHABET.len()]));
        }
    }
    key
}

fn key_hash(salt: &str, key: &str) -> String {
    hex::encode(Sha256::new().chain_update(salt.as_bytes()).chain_update(key.as_bytes()).finalize())
}

/// The transfer flows, over the service's shared core.
pub struct Transfers<'a>(&'a Service);

impl Service {
    /// Volume transfers: the flows of `transfers.rs`.
    pub fn transfers(&self) -> Transfers<'_> {
        Transfers(self)
    }
}

impl Transfers<'_> {
    /// Offers an available volume the caller can reach; returns the offer and its key.
    pub async fn create(
        &self,
        caller: &Caller,
        volume_id: &str,
        name: Option<String>,
    ) -> Result<Offered, AttachError> {
        let name = bounds::trimmed(name);
        bounds::text("name", name.as_deref(), bounds::MAX_NAME)?;
        let service = self.0;
        let volume = service.volume(caller, volume_id).await?;
        let auth_key = random_key();
        let mut salt = [0u8; 16];
        getrandom::fill(&mut salt).expect("the operating system's random number generator failed");
        let salt = hex::encode(salt);
        let transfer = Transfer {
            id: uuid::Uuid::new_v4().to_string(),
            volume_id: volume.id.clone(),
            name,
            source_project_id: volume.project_id.clone(),
            key_hash: key_hash(&salt, &auth_key),
            salt,
            created_at: crate::store::now_micros(),
        };
        let t = transition(Event::OfferTransfer);
        let _lock = service.locks.lock(volume_id).await;
        service
            .store
            .write(async |tx| {
                let Some(locked) = volumes::lock(tx, volume_id, t, None).await? else {
                    return Err(AttachError::InvalidVolume(format!(
                        "Volume {volume_id} status must be {} to transfer, but the current status is {}.",
                        names(t.volume_from(false)),
                        volume.status
                    )));
                };
                transfers::insert(tx, &transfer).await?;
                conclude(tx, &locked, t).await
            })
            .await?;
        tracing::info!(volume = %volume_id, transfer = %transfer.id, "volume offered for transfer");
        Ok(Offered { transfer, auth_key })
    }

    /// Takes the volume of transfer `id` over for the caller's project, if `auth_key` is the
    /// transfer's: any project may, as the key is the proof. A wrong key changes nothing.
    pub async fn accept(&self, caller: &Caller, id: &str, auth_key: &str) -> Result<Transfer, AttachError> {
        let service = self.0;
        let offer = service
            .store
            .read(async |tx| transfers::get(tx, id, Scope::All).await)
            .await?
            .ok_or_else(|| transfer_not_found(id))?;
        if key_hash(&offer.salt, auth_key) != offer.key_hash {
            return Err(AttachError::InvalidInput(format!(
                "Attempt to transfer {id} with invalid auth key."
            )));
        }
        let t = transition(Event::AcceptTransfer);
        let volume_id = offer.volume_id.as_str();
        let _lock = service.locks.lock(volume_id).await;
        service
            .store
            .write(async |tx| {
                let Some(locked) = volumes::lock(tx, volume_id, t, None).await? else {
                    return Err(volume_not_found(volume_id));
                };
                if !transfers::delete(tx, id).await? {
                    return Err(transfer_not_found(id));
                }
                if locked.project_id != caller.project_id {
                    let change = quotas::Change::volume(&locked.volume_type, locked.size_gib);
                    service.within_quota(tx, &caller.project_id, &change).await?;
                }
                volumes::set_owner(tx, volume_id, &caller.project_id, &caller.user_id).await?;
                let taken = conclude(tx, &locked, t).await?;
                let change = Change {
                    event: t.event,
                    access: Access::None,
                    attachment: None,
                    connector: None,
                    outcome: Some("transferred"),
                };
                service.record(tx, &taken, change).await
            })
            .await?;
        tracing::info!(
            volume = %volume_id, transfer = %id, from = %offer.source_project_id, to = %caller.project_id,
            "volume transferred"
        );
        Ok(offer)
    }

    /// Withdraws an offer of the caller's project (any, for an admin): the volume is available
    /// to its project again.
    pub async fn delete(&self, caller: &Caller, id: &str) -> Result<(), AttachError> {
        let service = self.0;
        let offer = self.show(caller, id).await?;
        let t = transition(Event::CancelTransfer);
        let _lock = service.locks.lock(&offer.volume_id).await;
        service
            .store
            .write(async |tx| {
                if !transfers::delete(tx, id).await? {
                    return Err(transfer_not_found(id));
                }
                if let Some(locked) = volumes::lock(tx, &offer.volume_id, t, None).await? {
                    conclude(tx, &locked, t).await?;
                }
                Ok::<_, AttachError>(())
            })
            .await
    }

    /// An offer of the caller's project (any, for an admin).
    pub async fn show(&self, caller: &Caller, id: &str) -> Result<Transfer, AttachError> {
        self.0
            .store
            .read(async |tx| transfers::get(tx, id, caller.scope()).await)
            .await?
            .ok_or_else(|| transfer_not_found(id))
    }

    /// The offers of the caller's project (every project's, for an admin who asks).
    pub async fn list(&self, scope: Scope<'_>) -> Result<Vec<Transfer>, AttachError> {
        Ok(self.0.store.read(async |tx| transfers::list(tx, scope).await).await?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_sixteen_letters_or_digits_and_differ() {
        let (a, b) = (random_key(), random_key());
        assert_eq!(a.len(), KEY_LENGTH);
        assert!(a.bytes().all(|c| KEY_ALPHABET.contains(&c)), "{a}");
        assert_ne!(a, b);
        assert_ne!(key_hash("s1", &a), key_hash("s2", &a), "salted");
    }
}
