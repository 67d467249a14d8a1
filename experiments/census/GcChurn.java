/*
 * GcChurn.java - a GC-heavy Java program for the census: for SECONDS it
 * allocates byte arrays of 16 B to 64 KiB, keeps a rotating quarter of them
 * alive (so objects age into the old generation and old collections run)
 * and drops the rest at once.  It prints how many collections each
 * collector ran, so a recipe shows that several did.
 *
 *   java -Xms128m -Xmx384m GcChurn SECONDS
 */
import java.lang.management.GarbageCollectorMXBean;
import java.lang.management.ManagementFactory;
import java.util.SplittableRandom;

public class GcChurn {
    public static void main(String[] args) {
        long end = System.nanoTime() + (long) (Double.parseDouble(args[0]) * 1e9);
        SplittableRandom rnd = new SplittableRandom(1);
        byte[][] kept = new byte[1 << 14][];
        long allocated = 0;
        while (System.nanoTime() < end) {
            for (int i = 0; i < 10000; i++) {
                byte[] b = new byte[16 << rnd.nextInt(13)];
                allocated += b.length;
                if ((i & 3) == 0)
                    kept[rnd.nextInt(kept.length)] = b;
            }
        }
        System.out.printf("allocated_mib=%d%n", allocated >> 20);
        for (GarbageCollectorMXBean gc : ManagementFactory.getGarbageCollectorMXBeans())
            System.out.printf("gc %s: %d collections, %d ms%n", gc.getName(),
                              gc.getCollectionCount(), gc.getCollectionTime());
    }
}
