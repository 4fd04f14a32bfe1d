// A pgjq worker in Node.js (node-postgres).  Usage: node worker.js postgres://localhost/app emails
const { Client } = require('pg');

async function main(url, queue) {
  const client = new Client({ connectionString: url });
  await client.connect();
  for (;;) {
    const { rows } = await client.query(
      "SELECT id, token, payload FROM pgjq.claim($1, batch => 10, wait => '10 s')", [queue]);
    for (const job of rows) {
      try {
        console.log('running', job.id, job.payload);
        const r = await client.query('SELECT pgjq.complete($1::bigint, $2::bigint) AS ok',
          [job.id, job.token]);
        if (!r.rows[0].ok) console.log('lease lost for job', job.id);
      } catch (err) {
        await client.query('SELECT pgjq.fail($1::bigint, $2::bigint, $3)',
          [job.id, job.token, String(err)]);
      }
    }
  }
}

main(process.argv[2], process.argv[3]).catch((e) => { console.error(e); process.exit(1); });
