// Applies tokenwire's Kafka users and ACLs to a running broker, logged in as the super
// user over SASL_SSL. Run by infra/kafka.sh (Java's single-file launcher, on the broker's
// own jars) after a secured broker starts:
//
//   java -cp "$LIBS/*" infra/kafka/SecurityTool.java BOOTSTRAP CA_FILE ADMIN_USER ADMIN_PASSWORD_FILE
//
// It reads lines from stdin, passwords always from files (never on a command line):
//   user NAME PASSWORD_FILE                       SCRAM-SHA-512 and -256 credentials (upsert)
//   acl NAME OPERATION RESOURCE PATTERN RESOURCE_NAME    one ALLOW rule for User:NAME
// Both are idempotent: a restart applies the same lines again.
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.List;
import java.util.Properties;
import java.util.Scanner;
import java.util.concurrent.TimeUnit;
import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.ScramCredentialInfo;
import org.apache.kafka.clients.admin.ScramMechanism;
import org.apache.kafka.clients.admin.UserScramCredentialAlteration;
import org.apache.kafka.clients.admin.UserScramCredentialUpsertion;
import org.apache.kafka.common.acl.AccessControlEntry;
import org.apache.kafka.common.acl.AclBinding;
import org.apache.kafka.common.acl.AclOperation;
import org.apache.kafka.common.acl.AclPermissionType;
import org.apache.kafka.common.resource.PatternType;
import org.apache.kafka.common.resource.ResourcePattern;
import org.apache.kafka.common.resource.ResourceType;

public class SecurityTool {
  static String read(String file) throws Exception {
    return Files.readString(Path.of(file)).strip();
  }

  public static void main(String[] args) throws Exception {
    if (args.length != 4) {
      System.err.println("usage: SecurityTool BOOTSTRAP CA_FILE ADMIN_USER ADMIN_PASSWORD_FILE");
      System.exit(2);
    }
    Properties props = new Properties();
    props.put("bootstrap.servers", args[0]);
    props.put("security.protocol", "SASL_SSL");
    props.put("sasl.mechanism", "SCRAM-SHA-512");
    props.put(
        "sasl.jaas.config",
        "org.apache.kafka.common.security.scram.ScramLoginModule required username=\""
            + args[2] + "\" password=\"" + read(args[3]) + "\";");
    props.put("ssl.truststore.type", "PEM");
    props.put("ssl.truststore.location", args[1]);
    props.put("default.api.timeout.ms", "60000");

    // One request per mechanism: a request may alter each user's credentials only once.
    List<UserScramCredentialAlteration> sha512 = new ArrayList<>();
    List<UserScramCredentialAlteration> sha256 = new ArrayList<>();
    List<AclBinding> acls = new ArrayList<>();
    Scanner in = new Scanner(System.in);
    while (in.hasNextLine()) {
      String[] f = in.nextLine().trim().split("\\s+");
      if (f.length == 3 && f[0].equals("user")) {
        String password = read(f[2]);
        sha512.add(new UserScramCredentialUpsertion(
            f[1], new ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, 8192), password));
        sha256.add(new UserScramCredentialUpsertion(
            f[1], new ScramCredentialInfo(ScramMechanism.SCRAM_SHA_256, 8192), password));
      } else if (f.length == 6 && f[0].equals("acl")) {
        acls.add(new AclBinding(
            new ResourcePattern(ResourceType.fromString(f[3]), f[5], PatternType.fromString(f[4])),
            new AccessControlEntry("User:" + f[1], "*", AclOperation.fromString(f[2]),
                AclPermissionType.ALLOW)));
      } else if (f.length > 0 && !f[0].isEmpty()) {
        throw new IllegalArgumentException("bad line: " + String.join(" ", f));
      }
    }
    for (AclBinding b : acls) {
      if (b.isUnknown()) throw new IllegalArgumentException("unknown ACL element in " + b);
    }
    try (Admin admin = Admin.create(props)) {
      for (List<UserScramCredentialAlteration> users : List.of(sha512, sha256)) {
        if (!users.isEmpty()) admin.alterUserScramCredentials(users).all().get(60, TimeUnit.SECONDS);
      }
      if (!acls.isEmpty()) admin.createAcls(acls).all().get(60, TimeUnit.SECONDS);
    }
    System.out.println(sha512.size() + " users, " + acls.size() + " ACLs applied");
  }
}
