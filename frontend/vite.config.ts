import react from "@vitejs/plugin-react";
import { defineConfig } from "vitest/config";

// Django serves dist/index.html for every app route and dist/* as static files under /static/.
export default defineConfig({
  base: "/static/",
  plugins: [react()],
  build: { outDir: "dist", emptyOutDir: true, sourcemap: false },
  server: {
    proxy: {
      "/api": "http://127.0.0.1:8000",
      "/ws": { target: "ws://127.0.0.1:8000", ws: true },
    },
  },
  test: { include: ["src/**/*.test.ts"], environment: "node" },
});
