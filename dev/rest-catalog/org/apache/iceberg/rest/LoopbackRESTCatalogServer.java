/*
 * Dev-stack launcher for Iceberg's RESTCatalogServer (iceberg-open-api runnable jar).
 *
 * RESTCatalogServer.main binds Jetty to every interface (new Server(port)). The dev stack must listen on
 * 127.0.0.1 only, so this launcher builds the same backend catalog and servlet but with a connector bound
 * to an explicit host. It lives in the org.apache.iceberg.rest package to reach the package-private
 * pieces (RCKUtils.environmentCatalogConfig, RESTServerCatalogAdapter, RESTCatalogServer.CatalogContext).
 *
 * Configuration is the upstream one: CATALOG_* environment variables (CATALOG_URI -> uri,
 * CATALOG_JDBC_USER -> jdbc.user, CATALOG_IO__IMPL -> io-impl, ...), plus
 *   rest.port (CATALOG_REST_PORT, default 8181) and rest.host (CATALOG_REST_HOST, default 127.0.0.1).
 */
package org.apache.iceberg.rest;

import java.util.Map;
import org.apache.hadoop.conf.Configuration;
import org.apache.iceberg.CatalogProperties;
import org.apache.iceberg.CatalogUtil;
import org.apache.iceberg.catalog.Catalog;
import org.apache.iceberg.jdbc.JdbcCatalog;
import org.apache.iceberg.relocated.com.google.common.collect.Maps;
import org.apache.iceberg.util.PropertyUtil;
import org.eclipse.jetty.server.Server;
import org.eclipse.jetty.server.ServerConnector;
import org.eclipse.jetty.server.handler.gzip.GzipHandler;
import org.eclipse.jetty.servlet.ServletContextHandler;
import org.eclipse.jetty.servlet.ServletHolder;

public final class LoopbackRESTCatalogServer {
  private LoopbackRESTCatalogServer() {}

  public static void main(String[] args) throws Exception {
    Map<String, String> props = Maps.newHashMap(RCKUtils.environmentCatalogConfig());
    props.putIfAbsent(CatalogProperties.CATALOG_IMPL, JdbcCatalog.class.getName());
    props.putIfAbsent("jdbc.schema-version", "V1");
    if (!props.containsKey(CatalogProperties.URI) || !props.containsKey(CatalogProperties.WAREHOUSE_LOCATION)) {
      throw new IllegalArgumentException("CATALOG_URI and CATALOG_WAREHOUSE must be set");
    }
    String host = props.getOrDefault("rest.host", "127.0.0.1");
    int port = PropertyUtil.propertyAsInt(props, "rest.port", 8181);
    String name = props.getOrDefault("catalog.name", "rest_backend");

    Catalog catalog = CatalogUtil.buildIcebergCatalog(name, props, new Configuration());
    RESTCatalogAdapter adapter =
        new RESTServerCatalogAdapter(new RESTCatalogServer.CatalogContext(catalog, props));

    ServletContextHandler context = new ServletContextHandler(ServletContextHandler.NO_SESSIONS);
    context.addServlet(new ServletHolder(new RESTCatalogServlet(adapter)), "/*");
    context.insertHandler(new GzipHandler());

    Server server = new Server();
    ServerConnector connector = new ServerConnector(server);
    connector.setHost(host);
    connector.setPort(port);
    server.addConnector(connector);
    server.setHandler(context);
    server.start();
    System.out.println("Iceberg REST catalog listening on http://" + host + ":" + port + "/ (catalog " + name + ")");
    server.join();
  }
}
