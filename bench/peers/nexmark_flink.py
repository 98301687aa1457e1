# Nexmark on Flink SQL (PyFlink; every operator runs in the JVM MiniCluster, no Python UDFs)
# over the CSV files `nopstream-bench nexmark-gen` writes (persons.csv, auctions.csv,
# bids.csv; a `#` header line, skipped as a comment). The queries are the nexmark
# repository's (nexmark-flink/src/main/resources/queries/q*.sql) on these tables.
#
# env: Q=q0|q1|q2|q3|q4|q5|q7|q8|q9|q11  DATA=<dir>  PAR=1  CKPT_MS=0
#      BACKEND=hashmap|rocksdb  OUT=<dir> (optional: a CSV sink instead of the blackhole,
#      whose rows the bench counts; append-only queries only)
# prints: RESULT q=.. job_s=.. setup_s=..  JVMCPU jvm_cpu_s=..
import os, time
from pyflink.table import EnvironmentSettings, TableEnvironment

Q = os.environ.get("Q", "q0")
DATA = os.path.abspath(os.environ["DATA"])
PAR = os.environ.get("PAR", "1")
CKPT = int(os.environ.get("CKPT_MS", "0"))
BACKEND = os.environ.get("BACKEND", "hashmap")
OUT = os.environ.get("OUT", "")

t_start = time.time()
t_env = TableEnvironment.create(EnvironmentSettings.in_streaming_mode())
c = t_env.get_config()
c.set("parallelism.default", PAR)
c.set("pipeline.object-reuse", "true")
c.set("state.backend.type", BACKEND)
if CKPT > 0:
    c.set("execution.checkpointing.interval", f"{CKPT} ms")
    c.set("execution.checkpointing.mode", "EXACTLY_ONCE")
    c.set("execution.checkpointing.dir", "file://" + os.path.abspath("flink-ckpt"))

def table(name, cols, file):
    t_env.execute_sql(f"""
CREATE TABLE {name} ({cols},
  `dateTime` AS TO_TIMESTAMP_LTZ(date_time, 3),
  WATERMARK FOR `dateTime` AS `dateTime`
) WITH ('connector'='filesystem', 'path'='file://{DATA}/{file}', 'format'='csv',
        'csv.allow-comments'='true')""")

table("person", "id BIGINT, name STRING, emailAddress STRING, creditCard STRING, city STRING, "
      "state STRING, date_time BIGINT, extra STRING", "persons.csv")
table("auction", "id BIGINT, itemName STRING, description STRING, initialBid BIGINT, "
      "reserve BIGINT, date_time BIGINT, expires_ms BIGINT, seller BIGINT, category BIGINT, "
      "extra STRING", "auctions.csv")
table("bid", "auction BIGINT, bidder BIGINT, price BIGINT, channel STRING, url STRING, "
      "date_time BIGINT, extra STRING", "bids.csv")
t_env.execute_sql("CREATE TEMPORARY VIEW auction_v AS SELECT *, TO_TIMESTAMP_LTZ(expires_ms, 3) AS expires FROM auction")

QUERIES = {
    "q0": ("auction BIGINT, bidder BIGINT, price BIGINT, dt TIMESTAMP_LTZ(3), extra STRING",
           "SELECT auction, bidder, price, `dateTime`, extra FROM bid"),
    "q1": ("auction BIGINT, bidder BIGINT, price DECIMAL(23, 3), dt TIMESTAMP_LTZ(3), extra STRING",
           "SELECT auction, bidder, 0.908 * price, `dateTime`, extra FROM bid"),
    "q2": ("auction BIGINT, price BIGINT",
           "SELECT auction, price FROM bid WHERE MOD(auction, 123) = 0"),
    "q3": ("name STRING, city STRING, state STRING, id BIGINT",
           """SELECT P.name, P.city, P.state, A.id FROM auction AS A INNER JOIN person AS P
              ON A.seller = P.id
              WHERE A.category = 10 AND (P.state = 'OR' OR P.state = 'ID' OR P.state = 'CA')"""),
    "q4": ("id BIGINT, final BIGINT",
           """SELECT Q.category, AVG(Q.final) FROM (
                SELECT MAX(B.price) AS final, A.category FROM auction_v A, bid B
                WHERE A.id = B.auction AND B.`dateTime` BETWEEN A.`dateTime` AND A.expires
                GROUP BY A.id, A.category) Q
              GROUP BY Q.category"""),
    "q5": ("auction BIGINT, num BIGINT",
           """SELECT AuctionBids.auction, AuctionBids.num FROM (
                SELECT auction, count(*) AS num, window_start AS starttime, window_end AS endtime
                FROM TABLE(HOP(TABLE bid, DESCRIPTOR(`dateTime`), INTERVAL '2' SECOND, INTERVAL '10' SECOND))
                GROUP BY auction, window_start, window_end) AS AuctionBids
              JOIN (
                SELECT max(CountBids.num) AS maxn, CountBids.starttime, CountBids.endtime FROM (
                  SELECT count(*) AS num, window_start AS starttime, window_end AS endtime
                  FROM TABLE(HOP(TABLE bid, DESCRIPTOR(`dateTime`), INTERVAL '2' SECOND, INTERVAL '10' SECOND))
                  GROUP BY auction, window_start, window_end) AS CountBids
                GROUP BY CountBids.starttime, CountBids.endtime) AS MaxBids
              ON AuctionBids.starttime = MaxBids.starttime AND AuctionBids.endtime = MaxBids.endtime
                 AND AuctionBids.num >= MaxBids.maxn"""),
    "q7": ("auction BIGINT, price BIGINT, bidder BIGINT, dt TIMESTAMP_LTZ(3), extra STRING",
           """SELECT B.auction, B.price, B.bidder, B.`dateTime`, B.extra FROM bid B
              JOIN (SELECT MAX(price) AS maxprice, window_end AS `dateTime`
                    FROM TABLE(TUMBLE(TABLE bid, DESCRIPTOR(`dateTime`), INTERVAL '10' SECOND))
                    GROUP BY window_start, window_end) B1
              ON B.price = B1.maxprice
              WHERE B.`dateTime` BETWEEN B1.`dateTime` - INTERVAL '10' SECOND AND B1.`dateTime`"""),
    "q8": ("id BIGINT, name STRING, stime TIMESTAMP(3)",
           """SELECT P.id, P.name, P.starttime FROM (
                SELECT id, name, window_start AS starttime, window_end AS endtime
                FROM TABLE(TUMBLE(TABLE person, DESCRIPTOR(`dateTime`), INTERVAL '10' SECOND))
                GROUP BY id, name, window_start, window_end) P
              JOIN (
                SELECT seller, window_start AS starttime, window_end AS endtime
                FROM TABLE(TUMBLE(TABLE auction, DESCRIPTOR(`dateTime`), INTERVAL '10' SECOND))
                GROUP BY seller, window_start, window_end) A
              ON P.id = A.seller AND P.starttime = A.starttime AND P.endtime = A.endtime"""),
    "q9": ("id BIGINT, itemName STRING, description STRING, initialBid BIGINT, reserve BIGINT, "
           "dt TIMESTAMP_LTZ(3), expires TIMESTAMP_LTZ(3), seller BIGINT, category BIGINT, "
           "extra STRING, auction BIGINT, bidder BIGINT, price BIGINT, "
           "bid_dateTime TIMESTAMP_LTZ(3), bid_extra STRING",
           """SELECT id, itemName, description, initialBid, reserve, `dateTime`, expires, seller,
                     category, extra, auction, bidder, price, bid_dateTime, bid_extra FROM (
                SELECT A.id, A.itemName, A.description, A.initialBid, A.reserve, A.`dateTime`,
                       A.expires, A.seller, A.category, A.extra, B.auction, B.bidder, B.price,
                       B.`dateTime` AS bid_dateTime, B.extra AS bid_extra,
                       ROW_NUMBER() OVER (PARTITION BY A.id ORDER BY B.price DESC, B.`dateTime` ASC) AS rownum
                FROM auction_v A, bid B
                WHERE A.id = B.auction AND B.`dateTime` BETWEEN A.`dateTime` AND A.expires)
              WHERE rownum <= 1"""),
    "q11": ("bidder BIGINT, bid_count BIGINT, starttime TIMESTAMP(3), endtime TIMESTAMP(3)",
            """SELECT B.bidder, count(*) AS bid_count,
                      SESSION_START(B.`dateTime`, INTERVAL '10' SECOND) AS starttime,
                      SESSION_END(B.`dateTime`, INTERVAL '10' SECOND) AS endtime
               FROM bid B GROUP BY B.bidder, SESSION(B.`dateTime`, INTERVAL '10' SECOND)"""),
}

cols, sql = QUERIES[Q]
if OUT:
    t_env.execute_sql(f"CREATE TABLE sink ({cols}) WITH ('connector'='filesystem', 'path'='file://{os.path.abspath(OUT)}', 'format'='csv')")
else:
    t_env.execute_sql(f"CREATE TABLE sink ({cols}) WITH ('connector'='blackhole')")
t_sub = time.time()
t_env.execute_sql(f"INSERT INTO sink {sql}").wait()
t_end = time.time()

def children_cpu_s(pid):
    tick = os.sysconf("SC_CLK_TCK"); tot = 0.0
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            st = open(f"/proc/{d}/stat").read()
        except OSError:
            continue
        f = st[st.rindex(")") + 2:].split()
        if int(f[1]) == pid:
            tot += (int(f[11]) + int(f[12])) / tick + children_cpu_s(int(d))
    return tot

print(f"JVMCPU jvm_cpu_s={children_cpu_s(os.getpid()):.2f}", flush=True)
print(f"RESULT q={Q} par={PAR} ckpt_ms={CKPT} backend={BACKEND} "
      f"setup_s={t_sub - t_start:.2f} job_s={t_end - t_sub:.2f}", flush=True)
