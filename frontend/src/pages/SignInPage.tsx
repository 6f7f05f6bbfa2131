import { type FormEvent, useEffect, useState } from "react";

import { ApiError, api } from "../api/client";
import type { Me, Sso } from "../api/types";

/** `ended`: the session ended while a page was open (signed out in another tab, or expired); the
 * page is the one asked for, shown again once signed in. */
export function SignInPage({ onSignedIn, ended = false }: { onSignedIn: (me: Me) => void; ended?: boolean }) {
  const [username, setUsername] = useState("");
  const [password, setPassword] = useState("");
  const [error, setError] = useState<string | null>(null);
  const [busy, setBusy] = useState(false);
  const [sso, setSso] = useState<Sso | null>(null);

  useEffect(() => {
    api<Sso>("/api/v1/session/sso/", { quiet401: true })
      .then(setSso)
      .catch(() => setSso(null)); // the password form works without it
  }, []);

  const submit = async (event: FormEvent) => {
    event.preventDefault();
    setBusy(true);
    setError(null);
    try {
      // The GET sets the CSRF cookie that the POST must echo.
      await api("/api/v1/session/", { quiet401: true }).catch(() => undefined);
      const me = await api<Me>("/api/v1/session/", { method: "POST", body: { username, password }, quiet401: true });
      onSignedIn(me);
    } catch (err) {
      setError(err instanceof ApiError || err instanceof Error ? err.message : String(err));
      setBusy(false);
    }
  };

  return (
    <main className="center-page">
      <form className="card signin" onSubmit={submit} aria-labelledby="signin-title">
        <h1 id="signin-title">Sign in to GPU Portal</h1>
        {ended && (
          <p className="notice" role="status">
            You were signed out (in another tab, or your sign-in expired). Sign in again to go back to this page.
          </p>
        )}
        <label htmlFor="username">User name</label>
        <input
          id="username"
          name="username"
          autoComplete="username"
          required
          autoFocus
          value={username}
          onChange={(e) => setUsername(e.target.value)}
        />
        <label htmlFor="password">Password</label>
        <input
          id="password"
          name="password"
          type="password"
          autoComplete="current-password"
          required
          value={password}
          onChange={(e) => setPassword(e.target.value)}
        />
        {error && (
          <p className="field-error" role="alert">
            {error}
          </p>
        )}
        <button type="submit" className="button primary" disabled={busy}>
          {busy ? "Signing in…" : "Sign in"}
        </button>
        {sso?.enabled && (
          <>
            <p className="signin-or">or</p>
            <a className="button" href={`${sso.login_url}?${new URLSearchParams({ next: landing() })}`}>
              Sign in with {sso.name}
            </a>
          </>
        )}
      </form>
    </main>
  );
}

/** The page that asked for a sign-in, to come back to from the sign-on provider. */
function landing(): string {
  return window.location.pathname + window.location.search;
}
