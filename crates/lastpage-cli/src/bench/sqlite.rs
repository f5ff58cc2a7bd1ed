//! SQLite, set up the way an embedded application usually runs it, as the yardstick for
//! durable inserts: WAL journal mode, `synchronous=FULL` (every commit fsyncs the WAL), and one
//! connection shared by every thread behind a mutex (SQLite allows one writer at a time anyway,
//! so more connections would only add `SQLITE_BUSY` retries).
//!
//! The table mirrors the benchmark's `InsertContention_100`: `InsertID INTEGER PRIMARY KEY`
//! (the rowid, ascending like an IDENTITY) and a `Name TEXT` payload of the same bytes.

use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};

use rusqlite::Connection;

/// The benchmark table in SQLite.
const CREATE_TABLE: &str =
    "CREATE TABLE InsertContention (InsertID INTEGER PRIMARY KEY, Name TEXT NOT NULL)";

/// The single-row insert every statement runs (prepared once, cached by the connection).
const INSERT: &str = "INSERT INTO InsertContention (Name) VALUES (?1)";

/// One SQLite database file with its shared connection.
pub struct SqliteBench {
    connection: Mutex<Connection>,
    path: PathBuf,
}

impl SqliteBench {
    /// Creates a fresh database at `path` (which must not exist yet) in WAL mode with
    /// `synchronous=FULL`, and the benchmark table.
    pub fn create(path: &Path) -> Result<SqliteBench, String> {
        if path.exists() {
            return Err(format!(
                "{} already exists; SQLite's side of the benchmark needs a fresh file",
                path.display()
            ));
        }
        let failed = |what: &str, error: rusqlite::Error| {
            format!("SQLite: {what} ({}): {error}", path.display())
        };
        let connection =
            Connection::open(path).map_err(|error| failed("cannot open the database", error))?;
        // journal_mode answers with the mode it ended up in: a file system without shared
        // memory support would silently stay in rollback-journal mode.
        let mode: String = connection
            .query_row("PRAGMA journal_mode=WAL", [], |row| row.get(0))
            .map_err(|error| failed("cannot switch to WAL mode", error))?;
        if !mode.eq_ignore_ascii_case("wal") {
            return Err(format!(
                "SQLite: {} stayed in journal mode {mode}, not WAL",
                path.display()
            ));
        }
        connection
            .execute_batch("PRAGMA synchronous=FULL;")
            .map_err(|error| failed("cannot set synchronous=FULL", error))?;
        let synchronous: i64 = connection
            .query_row("PRAGMA synchronous", [], |row| row.get(0))
            .map_err(|error| failed("cannot read synchronous", error))?;
        // 2 is FULL.
        if synchronous != 2 {
            return Err(format!(
                "SQLite: synchronous is {synchronous}, not FULL (2)"
            ));
        }
        connection
            .execute_batch(CREATE_TABLE)
            .map_err(|error| failed("cannot create the table", error))?;
        Ok(SqliteBench {
            connection: Mutex::new(connection),
            path: path.to_owned(),
        })
    }

    fn connection(&self) -> MutexGuard<'_, Connection> {
        // A thread that panicked while holding the connection left it usable: SQLite rolls an
        // unfinished statement back itself.
        self.connection
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// One autocommit single-row insert (a transaction of its own, fsynced at commit).
    pub fn insert(&self, payload: &str) -> Result<(), String> {
        let connection = self.connection();
        let mut statement = connection
            .prepare_cached(INSERT)
            .map_err(|error| format!("SQLite: cannot prepare the insert: {error}"))?;
        statement
            .execute([payload])
            .map(|_| ())
            .map_err(|error| format!("SQLite: insert failed: {error}"))
    }

    /// `rows` inserts in one transaction (one fsync at commit).
    pub fn insert_batch(&self, payload: &str, rows: u64) -> Result<(), String> {
        let mut connection = self.connection();
        let transaction = connection
            .transaction()
            .map_err(|error| format!("SQLite: cannot begin a transaction: {error}"))?;
        {
            let mut statement = transaction
                .prepare_cached(INSERT)
                .map_err(|error| format!("SQLite: cannot prepare the insert: {error}"))?;
            for _ in 0..rows {
                statement
                    .execute([payload])
                    .map_err(|error| format!("SQLite: insert failed: {error}"))?;
            }
        }
        transaction
            .commit()
            .map_err(|error| format!("SQLite: commit failed: {error}"))
    }

    /// Checks the table after a run: `expected` rows, ids 1..=expected, and SQLite's own
    /// integrity check. Returns `"ok"` or what was wrong.
    pub fn verify(&self, expected: u64) -> String {
        let connection = self.connection();
        let counts: rusqlite::Result<(i64, Option<i64>, Option<i64>)> = connection.query_row(
            "SELECT count(*), min(InsertID), max(InsertID) FROM InsertContention",
            [],
            |row| Ok((row.get(0)?, row.get(1)?, row.get(2)?)),
        );
        let expected_i64 = i64::try_from(expected).unwrap_or(i64::MAX);
        match counts {
            Err(error) => return format!("SQLite: cannot count the rows: {error}"),
            Ok((count, _, _)) if count != expected_i64 => {
                return format!("SQLite holds {count} rows, but {expected} were inserted");
            }
            Ok((_, min, max)) if expected > 0 && (min != Some(1) || max != Some(expected_i64)) => {
                return format!(
                    "SQLite's ids run from {min:?} to {max:?}, expected 1 to {expected}"
                );
            }
            Ok(_) => {}
        }
        match connection.query_row("PRAGMA integrity_check", [], |row| row.get::<_, String>(0)) {
            Ok(answer) if answer == "ok" => "ok".to_owned(),
            Ok(answer) => format!("SQLite's integrity check: {answer}"),
            Err(error) => format!("SQLite's integrity check failed: {error}"),
        }
    }

    /// Closes the connection and deletes the database file with its WAL and shared-memory
    /// files. Failures to delete are ignored: they leave files behind, nothing worse.
    pub fn remove(self) {
        let path = self.path.clone();
        drop(self.connection);
        for suffix in ["", "-wal", "-shm", "-journal"] {
            let mut name = path.clone().into_os_string();
            name.push(suffix);
            let _ = std::fs::remove_file(PathBuf::from(name));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!(
            "lastpage-sqlite-test-{}-{name}",
            std::process::id()
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("create a scratch directory");
        dir
    }

    #[test]
    fn single_rows_and_batches_from_threads_are_all_there() {
        let dir = scratch("rows");
        let bench = SqliteBench::create(&dir.join("bench.db")).expect("create");
        std::thread::scope(|scope| {
            for _ in 0..4 {
                scope.spawn(|| {
                    for _ in 0..10 {
                        bench.insert("payload").expect("insert");
                    }
                });
            }
        });
        bench.insert_batch("payload", 25).expect("batch");
        assert_eq!(bench.verify(65), "ok");
        assert!(bench.verify(64).contains("65 rows"));
        bench.remove();
        assert!(!dir.join("bench.db").exists());
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn an_existing_file_is_refused() {
        let dir = scratch("exists");
        let path = dir.join("bench.db");
        std::fs::write(&path, b"not a database").expect("write");
        let error = SqliteBench::create(&path).err().expect("refused");
        assert!(error.contains("already exists"), "{error}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
