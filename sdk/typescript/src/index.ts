// PandaStack SDK for Node.js (>= 18): ESM, no runtime dependencies (the platform's fetch).
// TypeScript, compiled by tsc to dist/ (ESM + declarations): sdk/typescript/build.sh.
//
//   import { Sandbox } from "@pandastack/sdk";
//   const sbx = await Sandbox.create();          // PANDASTACK_API_KEY, PANDASTACK_BASE_URL
//   console.log((await sbx.exec("echo hi")).stdout);
//   await sbx.kill();
//
// types.ts (options, answers), errors.ts (typed errors), http.ts (the REST client),
// sandbox.ts (Sandbox, Files, Processes), resources.ts (Template, Volume, Database);
// tools.ts (@pandastack/sdk/tools: sandbox tools for a model).
export * from "./types.js";
export * from "./errors.js";
export { Files, Processes, Sandbox } from "./sandbox.js";
export { Database, Secrets, Template, Volume } from "./resources.js";
