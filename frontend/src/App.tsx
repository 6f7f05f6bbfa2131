import { useCallback, useEffect, useRef, useState } from "react";

import { api, setUnauthorizedHandler } from "./api/client";
import { live, useLiveStatus } from "./api/live";
import type { Me } from "./api/types";
import { ErrorBanner, LiveIndicator, Spinner } from "./components/common";
import { ErrorBoundary } from "./components/ErrorBoundary";
import { ClusterPage } from "./pages/ClusterPage";
import { DashboardPage } from "./pages/DashboardPage";
import { JobDetailPage } from "./pages/JobDetailPage";
import { JobListPage } from "./pages/JobListPage";
import { MembersIndexPage, MembersPage } from "./pages/MembersPage";
import { SignInPage } from "./pages/SignInPage";
import { SubmitPage } from "./pages/SubmitPage";
import { TokensPage } from "./pages/TokensPage";
import { UsagePage } from "./pages/UsagePage";
import { VirtualClusterPage, VirtualClustersPage } from "./pages/VirtualClusterPage";
import { Link, useLocation } from "./router";
import { SessionContext, signedInUser } from "./session";

// `ended`: the session ended while the page was open (signed out in another tab, or expired).
type SessionState =
  | { kind: "loading" }
  | { kind: "signed-out"; ended?: boolean }
  | { kind: "signed-in"; me: Me }
  | { kind: "error"; error: Error };

export function App() {
  const [session, setSession] = useState<SessionState>({ kind: "loading" });

  const probe = useCallback(() => {
    setSession({ kind: "loading" });
    signedInUser()
      .then((me) => setSession(me ? { kind: "signed-in", me } : { kind: "signed-out" }))
      .catch((err: unknown) => {
        setSession({ kind: "error", error: err instanceof Error ? err : new Error(String(err)) });
      });
  }, []);

  // Whether the session still holds, after the live socket or a request was refused: if not,
  // the sign-in page replaces the page (at the same address, so signing in comes back to it).
  const checking = useRef(false);
  const ended = useCallback(() => setSession((old) => (old.kind === "signed-in" ? { kind: "signed-out", ended: true } : old)), []);
  const recheck = useCallback(() => {
    if (checking.current) return;
    checking.current = true;
    signedInUser()
      .then((me) => {
        if (!me) ended();
      })
      .catch(() => undefined) // no answer now: the page stays, and the next refusal asks again
      .finally(() => {
        checking.current = false;
      });
  }, [ended]);

  useEffect(() => {
    probe();
    setUnauthorizedHandler((status) => (status === 401 ? ended() : recheck()));
    return live.onRefused(recheck);
  }, [probe, ended, recheck]);

  useEffect(() => {
    if (session.kind === "signed-in") live.start();
    else live.stop();
  }, [session.kind]);

  const signOut = useCallback(() => {
    api("/api/v1/session/", { method: "DELETE" })
      .catch(() => undefined)
      .finally(() => setSession({ kind: "signed-out" }));
  }, []);

  if (session.kind === "loading") {
    return (
      <main className="center-page">
        <Spinner label="Opening GPU Portal" />
      </main>
    );
  }
  if (session.kind === "error") {
    return (
      <main className="center-page">
        <ErrorBanner error={session.error} onRetry={probe} />
      </main>
    );
  }
  if (session.kind === "signed-out") {
    return <SignInPage ended={session.ended === true} onSignedIn={(me) => setSession({ kind: "signed-in", me })} />;
  }
  return (
    <SessionContext.Provider value={{ me: session.me, signOut }}>
      <Shell me={session.me} signOut={signOut} />
    </SessionContext.Provider>
  );
}

// `also`: another path prefix under which the item's pages live (a tenant's members page is
// /tenants/NAME/members; /members opens one of them).
const NAV: { href: string; label: string; also?: string }[] = [
  { href: "/", label: "Dashboard" },
  { href: "/jobs", label: "Jobs" },
  { href: "/submit", label: "Submit" },
  { href: "/cluster", label: "Cluster" },
  { href: "/vcs", label: "Virtual clusters" },
  { href: "/usage", label: "Usage" },
  { href: "/members", label: "Members", also: "/tenants/" },
  { href: "/tokens", label: "Tokens & webhooks" },
];

function isCurrent(item: { href: string; also?: string }, path: string): boolean {
  const { href, also } = item;
  if (href === "/") return path === "/";
  return path === href || path.startsWith(`${href}/`) || (also !== undefined && path.startsWith(also));
}

function Shell({ me, signOut }: { me: Me; signOut: () => void }) {
  const { path } = useLocation();
  const status = useLiveStatus();
  const firstPath = useRef(path);
  useEffect(() => {
    // After moving to another page, keyboard and screen-reader users start at its content.
    if (path !== firstPath.current) document.getElementById("main")?.focus({ preventScroll: true });
    firstPath.current = "";
  }, [path]);
  return (
    <>
      <a className="skip-link" href="#main">
        Skip to content
      </a>
      <header className="topbar">
        <Link href="/" className="brand">
          GPU Portal
        </Link>
        <nav aria-label="Main">
          <ul>
            {NAV.map((item) => (
              <li key={item.href}>
                <Link href={item.href} aria-current={isCurrent(item, path) ? "page" : undefined}>
                  {item.label}
                </Link>
              </li>
            ))}
          </ul>
        </nav>
        <div className="user">
          <LiveIndicator status={status} />
          <span className="user-name" title={me.memberships.map((m) => `${m.tenant}: ${m.role}`).join(", ")}>
            {me.username}
          </span>
          <button type="button" className="button small ghost" onClick={signOut}>
            Sign out
          </button>
        </div>
      </header>
      <main id="main" tabIndex={-1}>
        <ErrorBoundary key={path}>
          <Page path={path} />
        </ErrorBoundary>
      </main>
    </>
  );
}

function Page({ path }: { path: string }) {
  const job = path.match(/^\/jobs\/(\d+)\/?$/);
  if (job?.[1]) return <JobDetailPage key={job[1]} id={Number(job[1])} />;
  const vc = path.match(/^\/vcs\/([^/]+)\/?$/);
  if (vc?.[1]) return <VirtualClusterPage key={vc[1]} name={decodeURIComponent(vc[1])} />;
  const members = path.match(/^\/tenants\/([^/]+)\/members\/?$/);
  if (members?.[1]) return <MembersPage key={members[1]} tenant={decodeURIComponent(members[1])} />;
  switch (path.replace(/\/$/, "") || "/") {
    case "/":
      return <DashboardPage />;
    case "/jobs":
      return <JobListPage />;
    case "/submit":
      return <SubmitPage />;
    case "/cluster":
      return <ClusterPage />;
    case "/vcs":
      return <VirtualClustersPage />;
    case "/usage":
      return <UsagePage />;
    case "/members":
      return <MembersIndexPage />;
    case "/tokens":
      return <TokensPage />;
    default:
      return (
        <div className="card">
          <h1>Not found</h1>
          <p>
            There is no page at <code>{path}</code>. <Link href="/">Go to the dashboard</Link>.
          </p>
        </div>
      );
  }
}
