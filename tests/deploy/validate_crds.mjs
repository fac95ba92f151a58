// Validate Prometheus Operator custom resources against the operator's published CRD schemas, as compiled
// into the npm package @kubernetes-models/prometheus-operator (installed by tools/install_deploy_tools.sh).
// stdin: a JSON array of objects; stdout: one line per object; exit 1 if any fails or has no schema.
import { readFileSync } from "node:fs";
import { pathToFileURL } from "node:url";

const modules = process.argv[2]; // .../node_modules
const objects = JSON.parse(readFileSync(0, "utf8"));
let failed = 0;
for (const object of objects) {
  const name = `${object.kind}/${object.metadata?.name}`;
  const file = `${modules}/@kubernetes-models/prometheus-operator/${object.apiVersion}/${object.kind}.js`;
  let Model;
  try {
    Model = (await import(pathToFileURL(file).href))[object.kind];
  } catch (error) {
    console.log(`ERROR ${name}: no published schema for ${object.apiVersion} ${object.kind}`);
    failed++;
    continue;
  }
  try {
    new Model(object).validate();
    console.log(`OK ${name} (${object.apiVersion})`);
  } catch (error) {
    console.log(`ERROR ${name}: ${error.message}`);
    failed++;
  }
}
process.exit(failed ? 1 : 0);
